"""UniLM (Dong et al. 2019, "Unified Language Model Pre-training for Natural Language Understanding and
Generation"): one bidirectional Transformer trained as four language models at once, each sample under one
self-attention mask, in the published mix:

    bidirectional   1/3   every token sees every token (masked LM)
    left_to_right   1/6   a token sees itself and the tokens before it
    right_to_left   1/6   a token sees itself and the tokens after it
    seq2seq         1/3   [CLS] source [SEP] target [SEP]: the source sees the source, a target token the source and
                          the target up to itself

Samples are BERT's pairs whose second segment continues the first (pretrain/data/bert.py, pair task `next`), masked by
`data.masking`; the masked tokens are predicted in every mode. A sample's mode is a hash of its (masked) tokens, and
its mask is a span per token (`attend_lo` .. `attend_hi`, the positions it sees) built on the host by `locate`: the
same sample trains under the same mask in any TP x DP x micro-batch layout, and no [b, s, s] mask crosses to the
device. The model is BERT's without NSP; it exports as BertForMaskedLM, and `decode` generates a target from a
source as UniLM does (a [MASK] appended at each step, predicted under the seq2seq mask).
"""
from __future__ import annotations

from dataclasses import dataclass

from pretrain.objectives.base import M32, Section, hash32
from pretrain.objectives.masked_lm import Masked
from pretrain.schema import opt

ORDER = 50
MODES = ("bidirectional", "left_to_right", "right_to_left", "seq2seq")
SPAN = ("attend_lo", "attend_hi")  # the batch fields of each token's span of attention


@dataclass
class UnilmConfig:
    mix: dict[str, float] = opt({"bidirectional": 2.0, "left_to_right": 1.0, "right_to_left": 1.0, "seq2seq": 2.0},
                                "relative share of samples trained under each mask: " + " | ".join(MODES)
                                + " (the paper's 1/3, 1/6, 1/6, 1/3)")


def check_section(cfg, need, objective) -> None:
    mix = cfg.unilm.mix
    unknown = sorted(set(mix) - set(MODES))
    need(not unknown, f"unilm.mix has unknown modes {', '.join(unknown)}; use {', '.join(MODES)}")
    need(unknown or mix and all(w >= 0 for w in mix.values()) and sum(mix.values()) > 0,
         f"unilm.mix={mix} must give non-negative shares to some of {', '.join(MODES)}; e.g. "
         "unilm.mix={bidirectional: 2, left_to_right: 1, right_to_left: 1, seq2seq: 2}")


def sample_modes(input_ids, mix: dict[str, float]):
    """Each sample's mode (an index into MODES) from a 32-bit hash of its tokens: a function of the sample alone,
    drawn with the shares of `mix`."""
    import torch

    b, s = input_ids.shape
    where = torch.arange(s, device=input_ids.device).expand(b, s)
    key = hash32(hash32((input_ids + (where << 20)) & M32).sum(1) & M32)
    u = (key >> 8).double() / float(1 << 24)  # in [0, 1)
    weights = torch.tensor([mix.get(m, 0.0) for m in MODES], dtype=torch.float64, device=input_ids.device)
    edges = weights.cumsum(0) / weights.sum()
    return torch.searchsorted(edges, u, right=True).clamp(max=len(MODES) - 1)


def spans(modes, attention_mask, token_type_ids):
    """(attend_lo, attend_hi) [b, s]: the first and last position each token attends to, under its sample's mode;
    padding tokens see the real ones (their outputs are never used). Segment 0 is the source (seq2seq)."""
    import torch

    b, s = attention_mask.shape
    i = torch.arange(s, device=attention_mask.device).expand(b, s)
    last = (attention_mask.sum(1, keepdim=True) - 1).expand(b, s)
    source_end = ((token_type_ids == 0) & attention_mask.bool()).sum(1, keepdim=True).expand(b, s) - 1
    mode = modes[:, None].expand(b, s)
    target = token_type_ids.bool()
    lo = torch.where(mode == MODES.index("right_to_left"), i, 0)
    hi = torch.where(mode == MODES.index("left_to_right"), i, last)
    hi = torch.where((mode == MODES.index("seq2seq")) & ~target, source_end, hi)
    hi = torch.where((mode == MODES.index("seq2seq")) & target, i, hi)
    real = attention_mask.bool()
    return torch.where(real, lo, 0), torch.where(real, hi, last)


class UniLM(Masked):
    name = "unilm"
    help = "unified LM: bidirectional, left-to-right, right-to-left and seq2seq masks in one batch (UniLM)"
    pair_task = "next"  # the second segment continues the first: seq2seq's source and target
    attention_mask = "per-token span"  # each token's [attend_lo, attend_hi]: an [b, 1, s, s] mask
    section = Section("unilm", UnilmConfig, check_section)
    headline = ("mlm_loss", "mlm_acc")
    mix = UnilmConfig().mix

    def configured(self, cfg) -> "UniLM":
        bound = super().configured(cfg)
        bound.mix = cfg.unilm.mix
        return bound

    def check(self, cfg, need) -> None:
        super().check(cfg, need)
        need("mlm" in cfg.model.heads and "nsp" not in cfg.model.heads,
             f"data.objective=unilm trains the model's mlm head alone but model.heads={cfg.model.heads}; set "
             "model.heads=[mlm]")
        need(cfg.model.type_vocab_size >= 2, f"data.objective=unilm tells source from target by segment but "
                                             f"model.type_vocab_size={cfg.model.type_vocab_size}; set it to 2")
        need(not cfg.data.unpadded, "data.unpadded=true is not supported with data.objective=unilm (its masks are "
                                    "spans of a sample's positions); remove data.unpadded")

    def select(self, batch, phase=None):
        return {"mlm": batch["labels"] != -100}

    def locate(self, batch, phase=None):
        """The sample's mode and each token's span of attention, with the masked tokens' indices."""
        modes = sample_modes(batch["input_ids"], self.mix)
        lo, hi = spans(modes, batch["attention_mask"], batch["token_type_ids"])
        return super().locate({**batch, "unilm_mode": modes, "attend_lo": lo, "attend_hi": hi}, phase)

    def compute(self, model, batch, phase=None, fused=False):
        """Masked LM on the masked tokens under each sample's mask; metrics per mode (accuracy, its unigram
        baseline at evaluation)."""
        from pretrain import losses

        batch = batch if "attend_lo" in batch else self.locate(batch, phase)
        masked = self.where(batch)["mlm"]
        target = losses.pick(batch["labels"], masked, 2)
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], positions=masked,
                    labels=target if fused else None, **{k: batch[k] for k in SPAN})
        if fused:
            return {"mlm": losses.fused_term(out["lm_loss"], target)}
        term = losses.token_term(out["logits"], target)
        right = losses.vocab_parallel_argmax(out["logits"].detach()) == target
        mode = self._token_modes(batch, masked)
        term.ratios = {f"mlm_acc_{m}": ((right & (mode == k)).sum(), (mode == k).sum()) for k, m in enumerate(MODES)}
        return {"mlm": term}

    def baselines(self, batch, terms, most_frequent):
        """Always answering the most frequent token, on the masked tokens of each mode and of all."""
        from pretrain import losses

        masked = self.where(batch)["mlm"]
        hit = losses.pick(batch["labels"], masked, 2) == most_frequent
        mode = self._token_modes(batch, masked)
        return {"mlm_unigram_acc": (hit.sum(), terms["mlm"].count),
                **{f"mlm_unigram_acc_{m}": ((hit & (mode == k)).sum(), (mode == k).sum()) for k, m in enumerate(MODES)}}

    @staticmethod
    def _token_modes(batch, masked):
        """The mode of each masked token (its sample's)."""
        from pretrain import losses

        rows = batch["unilm_mode"][:, None].expand_as(batch["input_ids"])
        return losses.pick(rows, masked, 2)


def decode(model, source, steps: int, ids: dict):
    """Greedy seq2seq generation as UniLM decodes: [CLS] source [SEP] then, for each of `steps` target tokens, a [MASK]
    appended in segment 1 and predicted under the seq2seq mask (the source sees the source, the target what comes
    before it and itself). `model` is a ptm model (or any callable (input_ids, token_type_ids, lo, hi) -> logits of the
    last position); `ids`: the tokenizer's special ids (cls, sep, mask). Returns the target's token ids."""
    import torch

    out = []
    for _ in range(steps):
        tokens = [ids["cls"], *source, ids["sep"], *out, ids["mask"]]
        x = torch.tensor([tokens])
        types = torch.tensor([[0] * (len(source) + 2) + [1] * (len(out) + 1)])
        lo, hi = spans(torch.tensor([MODES.index("seq2seq")]), torch.ones_like(x), types)
        logits = model(x, types, lo, hi)
        out.append(int(logits.argmax(-1)))
    return out


OBJECTIVES = (UniLM(),)
