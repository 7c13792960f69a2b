"""BART's denoising (samples: pretrain/data/bart.py) for encoder-decoder models: the encoder reads the sample with
its sentences permuted and 30% of its tokens in Poisson(3) spans each replaced by one mask, the decoder rebuilds the
original. One term, `lm`, over the target tokens (padding excluded)."""
from __future__ import annotations

import math

from pretrain.objectives.base import Objective

ORDER = 95


class Denoising(Objective):
    name = "denoising"
    help = "BART's text infilling (30%, Poisson(3) spans, one mask each) and sentence permutation (encoder-decoder)"
    headline = ("lm_loss",)

    def check(self, cfg, need) -> None:
        super().check(cfg, need)
        m = cfg.model
        need(m.decoder_layers > 0, f"data.objective={self.name} trains an encoder-decoder but model.decoder_layers=0; "
                                   f"set model.arch=bart (or model.decoder_layers)")
        need(m.type_vocab_size == 0, f"model.type_vocab_size={m.type_vocab_size}: denoising samples have one "
                                     f"segment; set model.type_vocab_size=0")
        need(not cfg.data.unpadded, f"data.unpadded=true packs BERT and ERNIE samples, not {self.name}'s; remove it")

    def predicted_tokens(self, data) -> int:
        return data.seq_len  # the decoder runs on seq_len positions (the original, padded)

    def source(self, path, corpus, docs, phase, cache_dir=None):
        from pretrain.data.bart import DenoisingDataset

        return DenoisingDataset(path, self.cfg.data.seq_len, seed=self.cfg.seed, docs=docs, cache_dir=cache_dir)

    def select(self, batch, phase=None):
        return {"lm": batch["labels"] != -100}

    def locate(self, batch, phase=None):
        return batch  # the loss runs over every position, 0 where the label is -100

    def compute(self, model, batch, phase=None, fused=False):
        from pretrain import kernels as K
        from pretrain.losses import Term

        count = self.select(batch)["lm"].sum()
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")}
        if fused:
            loss, _ = model(**inputs, labels=batch["labels"])["lm_loss"]
            return {"lm": Term(loss, count)}
        return {"lm": Term(K.cross_entropy(model(**inputs)["logits"], batch["labels"]).sum(), count)}

    def evaluation(self, metrics):
        return {"ppl": math.exp(min(metrics["lm_loss"], 50))} if "lm_loss" in metrics else {}


OBJECTIVES = (Denoising(),)
