"""Masked LM on a bidirectional model, alone or with a sentence-pair task (samples: pretrain/data/bert.py).

    mlm_nsp  BERT: [CLS] A [SEP] B [SEP]; B follows A or comes from another document (next sentence prediction)
    mlm_sop  ALBERT: B always follows A, and half the pairs are swapped (sentence order prediction)
    mlm      RoBERTa FULL-SENTENCES: whole sentences packed up to seq_len, no pair task

Terms: `mlm` over the masked tokens, `nsp` over the sequences (NSP or SOP, on the model's nsp head).
"""
from __future__ import annotations

from pretrain.objectives import Objective


class MaskedLM(Objective):
    def __init__(self, name: str, help_: str, pairs: bool):
        self.name, self.help, self.pairs = name, help_, pairs

    def check(self, cfg, need) -> None:
        super().check(cfg, need)
        need("mlm" in cfg.model.heads, f"data.objective={self.name} trains the model's mlm head but model.heads="
                                       f"{cfg.model.heads}; use a model with an mlm head (arch bert, roberta, albert)")
        need(not self.pairs or "nsp" in cfg.model.heads,
             f"data.objective={self.name} trains the model's nsp head but model.heads={cfg.model.heads}; add nsp to it")

    def source(self, data, path, corpus, docs, *, seed, cache_dir, knowledge_level, tasks, task_data):
        from pretrain.data.bert import BertDataset

        masker = self.masker(data, corpus, data.masking, knowledge_level)
        return BertDataset(path, data.seq_len, masker, objective=self.name, short_seq_prob=data.short_seq_prob,
                           seed=seed, docs=docs, cache_dir=cache_dir)

    def select(self, batch, tasks=()):
        out = {"mlm": batch["labels"] != -100}
        if "next_sentence_label" in batch:
            out["nsp"] = batch["next_sentence_label"] != -100
        return out

    def compute(self, model, batch, tasks=()):
        """The MLM head runs on the masked tokens alone; with the engine's `fused_lm_loss` (training only) it
        returns its loss and correct count instead of logits."""
        import torch

        from pretrain import losses

        fused = getattr(model, "fused_lm_loss", False) and torch.is_grad_enabled()
        where = self.where(batch)
        masked = where["mlm"]
        target = losses.pick(batch["labels"], masked, 2)
        out = model(batch["input_ids"], batch.get("attention_mask"), batch["token_type_ids"], batch.get("task_type_ids"),
                    positions=masked, labels=target if fused else None,
                    **{k: batch[k] for k in losses.PACKED if k in batch})
        if fused:
            terms = {"mlm": losses.Term(out["lm_loss"][0], target.new_full((), len(target)), out["lm_loss"][1])}
        else:
            terms = {"mlm": losses.token_term(out["logits"], target)}
        if "nsp" in where:
            terms["nsp"] = losses.class_term(out["nsp_logits"], batch["next_sentence_label"])
        return terms


MASKED_LM = (
    MaskedLM("mlm_nsp", "masked LM + next sentence prediction (BERT)", pairs=True),
    MaskedLM("mlm_sop", "masked LM + sentence order prediction (ALBERT)", pairs=True),
    MaskedLM("mlm", "masked LM on full sentences packed up to seq_len (RoBERTa)", pairs=False),
)
