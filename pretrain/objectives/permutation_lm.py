"""XLNet's permutation language modelling (samples: pretrain/data/permutation.py): each sample's predicted tokens are read by
the query stream at their positions, each seeing the unpredicted tokens and the predicted ones before it in a sampled
factorisation order, never its own token. One term, `lm`, over the predicted tokens (num_predict per sample)."""
from __future__ import annotations

from dataclasses import dataclass

from pretrain.objectives.base import Objective, Section
from pretrain.schema import opt

ORDER = 120


@dataclass
class XLNetConfig:
    num_predict: int = opt(0, "tokens predicted per sample; 0: seq_len x 85/512 (XLNet's 85 of 512)", range=">= 0")
    perm_size: int = opt(0, "the factorisation order is one permutation of this many positions applied to each "
                            "block of them; must divide data.seq_len (with model.reuse_len: the reused part and the "
                            "rest); 0: one permutation of all (of each part)", range=">= 0")


def num_predict(cfg) -> int:
    return cfg.xlnet.num_predict or round(cfg.data.seq_len * 85 / 512)


def check_section(cfg, need, objective) -> None:
    if objective.name != PermutationLM.name:
        return
    s, r, size, m = cfg.data.seq_len, cfg.model.reuse_len, cfg.xlnet.perm_size, cfg.model
    parts = (r, s - r) if r else (s,)
    need(r < s - 4, f"model.reuse_len={r} leaves no room for A and B in data.seq_len={s}; XLNet reuses half "
                    f"(lower it; 0: no reuse)")
    need(not size or all(p % size == 0 for p in parts),
         f"xlnet.perm_size={size} does not divide " + (f"model.reuse_len={r} and the rest, {s - r}" if r else
                                                       f"data.seq_len={s}") + "; pick a divisor (0: each whole)")
    n = num_predict(cfg)
    need(0 < n <= s - 3 and (not r or (n - n // 2 <= r and n // 2 <= s - r - 3)),
         f"xlnet.num_predict={n} must be between 1 and data.seq_len - 3 = {s - 3} (the tokens of A and B)"
         + (f", its larger half at most model.reuse_len={r} and its smaller half at most {s - r - 3}" if r else "")
         + "; set xlnet.num_predict within that")
    need(not m.mem_len or m.causal or r > 0,
         f"model.mem_len={m.mem_len} carries XLNet's memory, which keeps each sample's reused part; set "
         f"model.reuse_len (XLNet: 256 of data.seq_len 512)")


class PermutationLM(Objective):
    name = "plm"
    help = "XLNet's permutation LM: spans of whole words predicted in a sampled factorisation order, two streams"
    section = Section("xlnet", XLNetConfig, check_section)
    headline = ("lm_loss", "lm_acc")
    recurrent = True

    def check(self, cfg, need) -> None:
        m = cfg.model
        fix = "set model.arch=xlnet" if m.arch != "xlnet" else "set " + " and ".join(
            f for f, wrong in (("model.position_encoding=transformer_xl", m.position_encoding != "transformer_xl"),
                               ("model.causal=false", m.causal)) if wrong)
        need(m.position_encoding == "transformer_xl" and not m.causal,
             f"data.objective=plm trains XLNet's two-stream attention, but model.position_encoding="
             f"{m.position_encoding}, model.causal={m.causal}; {fix}")
        need(not cfg.data.unpadded, "data.unpadded=true packs BERT and ERNIE samples, not XLNet's; remove it")

    def predicted_tokens(self, data) -> int:
        return num_predict(self.cfg) if self.cfg is not None else round(data.seq_len * 85 / 512)

    def source(self, path, corpus, docs, phase, cache_dir=None):
        from pretrain.data.permutation import PermutationSamples

        c = self.cfg
        return PermutationSamples(path, c.data.seq_len, num_predict(c), c.xlnet.perm_size,
                                  reuse_len=c.model.reuse_len, streams=self.streams(), seed=c.seed, docs=docs,
                                  cache_dir=cache_dir)

    def select(self, batch, phase=None):
        return {"lm": batch["labels"] != -100}

    def compute(self, model, batch, phase=None, fused=False):
        from pretrain.losses import fused_term, pick, token_term

        where = self.where(batch, phase)["lm"]
        target = pick(batch["labels"], where, 2)
        inputs = dict(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                      perm_mask=batch["perm_mask"], targets=batch["targets"], **self.memory_inputs(model, batch))
        out = model(**inputs, **({"labels": target} if fused else {}))
        self.remember(model, batch, out)
        if fused:
            return {"lm": fused_term(out["lm_loss"], target)}
        return {"lm": token_term(pick(out["logits"], where, 2), target)}

    def baselines(self, batch, terms, most_frequent):
        return {"lm_unigram_acc": ((batch["labels"] == most_frequent).sum(), terms["lm"].count)}

    def evaluation(self, metrics):
        from pretrain.losses import perplexity

        return perplexity(metrics)


OBJECTIVES = (PermutationLM(),)
