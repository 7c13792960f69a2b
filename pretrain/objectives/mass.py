"""MASS (samples: pretrain/data/mass.py): masked sequence-to-sequence pretraining on a BART-shaped encoder-decoder:
half of each sentence masked in the encoder, the decoder predicting it from its shifted self. One term, `lm`, over
the masked fragments' tokens."""
from __future__ import annotations

from pretrain.objectives.base import Seq2Seq

ORDER = 96


class Mass(Seq2Seq):
    name = "mass"
    help = "MASS: one contiguous half of each sentence masked in the encoder, predicted by the decoder (encoder-decoder)"
    arch = "bart"

    def predicted_tokens(self, data) -> int:
        return data.seq_len // 2  # half of every sentence

    def source(self, path, corpus, docs, phase, cache_dir=None):
        from pretrain.data.mass import MassDataset

        return MassDataset(path, self.cfg.data.seq_len, seed=self.cfg.seed, docs=docs, cache_dir=cache_dir)


OBJECTIVES = (Mass(),)
