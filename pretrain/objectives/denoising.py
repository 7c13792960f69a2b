"""BART's denoising (samples: pretrain/data/bart.py) for encoder-decoder models: the encoder reads the sample with
its sentences permuted and 30% of its tokens in Poisson(3) spans each replaced by one mask, the decoder rebuilds the
original. One term, `lm`, over the target tokens (padding excluded); a second baseline copies the corrupted input."""
from __future__ import annotations

from pretrain.objectives.base import Seq2Seq

ORDER = 95


class Denoising(Seq2Seq):
    name = "denoising"
    help = "BART's text infilling (30%, Poisson(3) spans, one mask each) and sentence permutation (encoder-decoder)"
    arch = "bart"

    def predicted_tokens(self, data) -> int:
        return data.seq_len  # the decoder runs on seq_len positions (the original, padded)

    def source(self, path, corpus, docs, phase, cache_dir=None):
        from pretrain.data.bart import DenoisingDataset

        return DenoisingDataset(path, self.cfg.data.seq_len, seed=self.cfg.seed, docs=docs, cache_dir=cache_dir)

    def baselines(self, batch, terms, most_frequent):
        """And copying the corrupted input, position by position."""
        labels = batch["labels"]
        copied = ((labels == batch["input_ids"]) & (labels != -100)).sum()
        return {**super().baselines(batch, terms, most_frequent), "lm_copy_acc": (copied, terms["lm"].count)}


OBJECTIVES = (Denoising(),)
