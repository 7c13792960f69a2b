"""Causal LM (GPT-2): every next token of packed document windows (samples: pretrain/data/gpt.py). One term,
`lm`, over the tokens with a label."""
from __future__ import annotations

from pretrain.objectives import Objective


class CausalLM(Objective):
    name = "clm"
    help = "causal LM on packed documents (GPT-2)"
    causal = True

    def check(self, cfg, need) -> None:
        super().check(cfg, need)
        need(cfg.model.type_vocab_size == 0,
             f"model.type_vocab_size={cfg.model.type_vocab_size}: GPT-2 has no segment embeddings (causal LM samples "
             f"have one segment); set model.type_vocab_size=0")
        need(not cfg.data.unpadded, "data.unpadded=true packs BERT and ERNIE samples; GPT-2 windows are packed by "
                                    "data.pack_documents; remove data.unpadded")

    def predicted_tokens(self, data) -> int:
        return data.seq_len

    def source(self, data, path, corpus, docs, *, seed, cache_dir, knowledge_level, tasks, task_data):
        from pretrain.data.gpt import GPTDataset

        return GPTDataset(path, data.seq_len, seed=seed, docs=docs, cache_dir=cache_dir, pack=data.pack_documents)

    def select(self, batch, tasks=()):
        return {"lm": batch["labels"] != -100}

    def locate(self, batch, tasks=()):
        return batch  # nothing is picked: the loss runs over every token, 0 where the label is -100

    def compute(self, model, batch, tasks=()):
        import torch

        from pretrain import kernels as K
        from pretrain.losses import Term

        count = self.select(batch)["lm"].sum()
        if getattr(model, "fused_lm_loss", False) and torch.is_grad_enabled():
            loss, _ = model(batch["input_ids"], labels=batch["labels"])["lm_loss"]
            return {"lm": Term(loss, count)}
        logits = model(batch["input_ids"])["logits"]
        return {"lm": Term(K.cross_entropy(logits, batch["labels"]).sum(), count)}
