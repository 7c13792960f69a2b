"""What the encoder-decoder objectives (span_corruption, denoising, mass) share: the checks, the inputs of both
stacks, one term `lm` over the target tokens with a label (their flat indices found on the host: the LM head runs on
them alone), its accuracy, perplexity, and the unigram guess as a baseline."""
from __future__ import annotations

import math

from pretrain.objectives.base import Objective

INPUTS = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")


class Seq2Seq(Objective):
    headline = ("lm_loss", "lm_acc")
    arch = ""  # the family whose presets train on it, for the fix in the check's message

    def check(self, cfg, need) -> None:
        super().check(cfg, need)
        m = cfg.model
        need(m.decoder_layers > 0, f"data.objective={self.name} trains an encoder-decoder but model.decoder_layers=0; "
                                   f"set model.arch={self.arch} (or model.decoder_layers)")
        need(m.type_vocab_size == 0, f"model.type_vocab_size={m.type_vocab_size}: {self.name} samples have one "
                                     f"segment; set model.type_vocab_size=0")
        need(not cfg.data.unpadded, f"data.unpadded=true packs BERT and ERNIE samples, not {self.name}'s; remove it")

    def decoder_tokens(self, data) -> int:
        return data.seq_len  # the target (BART, MASS: aligned with the input, padded to seq_len)

    def select(self, batch, phase=None):
        return {"lm": batch["labels"] != -100}

    def compute(self, model, batch, phase=None, fused=False):
        import torch

        from pretrain.losses import Term, pick, token_term

        where = self.where(batch, phase)["lm"]
        target = pick(batch["labels"], where, 2)
        inputs = {k: batch[k] for k in INPUTS if k in batch}
        if fused:
            loss, correct = model(**inputs, positions=where, labels=target)["lm_loss"]
            return {"lm": Term(loss, target.new_full((), len(target)), correct)}
        logits = model(**inputs, positions=where)["logits"]
        term = token_term(logits, target)
        if not torch.is_grad_enabled():  # held-out evaluation
            term.ratios = self.held_out(logits, target)
        return {"lm": term}

    def held_out(self, logits, target) -> dict | None:
        """Metrics {name: (hits, count)} of the held-out evaluation from the target tokens' logits."""
        return None

    def baselines(self, batch, terms, most_frequent):
        """Always answering the most frequent token, on the target tokens."""
        return {"lm_unigram_acc": ((batch["labels"] == most_frequent).sum(), terms["lm"].count)}

    def evaluation(self, metrics):
        return {"ppl": math.exp(min(metrics["lm_loss"], 50))} if "lm_loss" in metrics else {}
