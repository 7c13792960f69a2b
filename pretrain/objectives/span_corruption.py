"""T5's span corruption (samples: pretrain/data/t5.py) for encoder-decoder models: the encoder reads the document
window with each noise span replaced by a sentinel, the decoder predicts the sentinels and their spans. One term,
`lm`, over every target token (the inputs fill data.seq_len and the targets their fixed length)."""
from __future__ import annotations

from pretrain.objectives.seq2seq import Seq2Seq

ORDER = 90


class SpanCorruption(Seq2Seq):
    name = "span_corruption"
    help = "T5's span corruption: noise density 0.15, mean span 3, one sentinel per span (encoder-decoder)"
    arch = "t5"

    def predicted_tokens(self, data) -> int:
        from pretrain.data.t5 import lengths

        return lengths(data.seq_len)[1]

    def decoder_tokens(self, data) -> int:
        return self.predicted_tokens(data)  # the target, every token of it predicted

    def source(self, path, corpus, docs, phase, cache_dir=None):
        from pretrain.data.t5 import SpanCorruption as Samples

        if not corpus.sentinel_ids:
            raise ValueError(f"{path} has no sentinels for span corruption; build it with `data_prep build "
                             f"--sentinels 100` (or --tokenizer of a dataset that has them)")
        return Samples(path, self.cfg.data.seq_len, corpus.sentinel_ids, seed=self.cfg.seed, docs=docs,
                       cache_dir=cache_dir)


OBJECTIVES = (SpanCorruption(),)
