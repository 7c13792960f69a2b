"""Causal LM (GPT, GPT-2): every next token of packed document windows (samples: pretrain/data/gpt.py). One term,
`lm`, over the tokens with a label."""
from __future__ import annotations

from pretrain.objectives.base import Objective

ORDER = 20


class CausalLM(Objective):
    name = "clm"
    help = "causal LM on packed documents (GPT-2)"
    causal = True
    packs_documents = True
    recurrent = True
    headline = ("lm_loss",)

    def check(self, cfg, need) -> None:
        super().check(cfg, need)
        need(cfg.model.type_vocab_size == 0,
             f"model.type_vocab_size={cfg.model.type_vocab_size}: causal LM samples have one segment, so no segment "
             f"embeddings; set model.type_vocab_size=0")
        need(not cfg.data.unpadded, "data.unpadded=true packs BERT and ERNIE samples; GPT-2 windows are packed by "
                                    "data.pack_documents; remove data.unpadded")

    def predicted_tokens(self, data) -> int:
        return data.seq_len

    def source(self, path, corpus, docs, phase, cache_dir=None):
        from pretrain.data.gpt import GPTDataset

        d = self.cfg.data
        return GPTDataset(path, d.seq_len, seed=self.cfg.seed, docs=docs, cache_dir=cache_dir, pack=d.pack_documents,
                          streams=self.streams())

    def select(self, batch, phase=None):
        return {"lm": batch["labels"] != -100}

    def locate(self, batch, phase=None):
        return batch  # nothing is picked: the loss runs over every token, 0 where the label is -100

    def compute(self, model, batch, phase=None, fused=False):
        from pretrain import kernels as K
        from pretrain.losses import Term

        count = self.select(batch)["lm"].sum()
        out = model(batch["input_ids"], **self.memory_inputs(model, batch),
                    **({"labels": batch["labels"]} if fused else {}))
        self.remember(model, batch, out)
        if fused:
            return {"lm": Term(out["lm_loss"][0], count)}
        return {"lm": Term(K.cross_entropy(out["logits"], batch["labels"]).sum(), count)}

    def evaluation(self, metrics):
        from pretrain.losses import perplexity

        return perplexity(metrics)


OBJECTIVES = (CausalLM(),)
