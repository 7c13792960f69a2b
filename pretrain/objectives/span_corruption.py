"""T5's span corruption (samples: pretrain/data/t5.py) for encoder-decoder models: the encoder reads the document
window with each noise span replaced by a sentinel, the decoder predicts the sentinels and their spans. One term,
`lm`, over every target token (all of them: the inputs fill data.seq_len and the targets their fixed length)."""
from __future__ import annotations

import math

from pretrain.objectives.base import Objective

ORDER = 90


class SpanCorruption(Objective):
    name = "span_corruption"
    help = "T5's span corruption: noise density 0.15, mean span 3, one sentinel per span (encoder-decoder)"
    headline = ("lm_loss",)

    def check(self, cfg, need) -> None:
        super().check(cfg, need)
        m = cfg.model
        need(m.decoder_layers > 0, f"data.objective={self.name} trains an encoder-decoder but model.decoder_layers=0; "
                                   f"set model.arch=t5 (or model.decoder_layers)")
        need(m.type_vocab_size == 0, f"model.type_vocab_size={m.type_vocab_size}: span corruption's samples have one "
                                     f"segment; set model.type_vocab_size=0")
        need(not cfg.data.unpadded, f"data.unpadded=true packs BERT and ERNIE samples; {self.name} windows fill "
                                    f"data.seq_len already; remove data.unpadded")

    def predicted_tokens(self, data) -> int:
        from pretrain.data.t5 import lengths

        return lengths(data.seq_len)[1]

    def source(self, path, corpus, docs, phase, cache_dir=None):
        from pretrain.data.t5 import SpanCorruption as Samples

        if not corpus.sentinel_ids:
            raise ValueError(f"{path} has no sentinels for span corruption; build it with `data_prep build "
                             f"--sentinels 100` (or --tokenizer of a dataset that has them)")
        return Samples(path, self.cfg.data.seq_len, corpus.sentinel_ids, seed=self.cfg.seed, docs=docs,
                       cache_dir=cache_dir)

    def select(self, batch, phase=None):
        return {"lm": batch["labels"] != -100}

    def locate(self, batch, phase=None):
        return batch  # nothing is picked: every target token is predicted

    def compute(self, model, batch, phase=None, fused=False):
        from pretrain import kernels as K
        from pretrain.losses import Term

        count = self.select(batch)["lm"].sum()
        inputs = {"input_ids": batch["input_ids"], "decoder_input_ids": batch["decoder_input_ids"]}
        if fused:
            loss, _ = model(**inputs, labels=batch["labels"])["lm_loss"]
            return {"lm": Term(loss, count)}
        return {"lm": Term(K.cross_entropy(model(**inputs)["logits"], batch["labels"]).sum(), count)}

    def evaluation(self, metrics):
        return {"ppl": math.exp(min(metrics["lm_loss"], 50))} if "lm_loss" in metrics else {}


OBJECTIVES = (SpanCorruption(),)
