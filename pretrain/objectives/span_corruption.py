"""T5's span corruption (samples: pretrain/data/t5.py) for encoder-decoder models: the encoder reads the document
window with each noise span replaced by a sentinel, the decoder predicts the sentinels and their spans. One term,
`lm`, over every target token (the inputs fill data.seq_len and the targets their fixed length).

Held-out evaluation adds how well the model fills the spans: `lm_span_acc`, its accuracy on the span tokens alone
(the sentinels and the end token left out) with the argmax over the other tokens, as the guess that knows a span token
is due; beside it `lm_span_unigram_acc`, always answering the data's most frequent token on the same tokens."""
from __future__ import annotations

import functools

from pretrain.objectives.base import Seq2Seq

ORDER = 90


@functools.lru_cache(maxsize=8)
def markers(path: str) -> tuple[int, ...]:
    """The target tokens of a dataset that are no span's: its sentinels and its end token."""
    from data_prep.dataset import Corpus

    corpus = Corpus(path)
    return (*corpus.sentinel_ids, corpus.special_ids["eod"])


class SpanCorruption(Seq2Seq):
    name = "span_corruption"
    sentinels = True
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
            raise ValueError(f"{path} has no sentinels for span corruption; add them without rebuilding: "
                             f"`python -m data_prep sentinels {path} --out {path.rstrip('/')}-t5`, then set "
                             f"data.path to it (or build with --sentinels 100)")
        return Samples(path, self.cfg.data.seq_len, corpus.sentinel_ids, seed=self.cfg.seed, docs=docs,
                       cache_dir=cache_dir)

    def held_out(self, logits, target):
        """`lm_span_acc`: the argmax over this TP rank's share of the vocabulary with the markers' columns left out,
        taken over every rank, on the span tokens."""
        import torch

        from pretrain.losses import vocab_parallel_argmax
        from pretrain.parallel import mcore

        marks = torch.tensor(markers(self.cfg.data.paths[0]), device=target.device)
        columns = torch.arange(logits.shape[-1], device=target.device) + mcore.tp_rank() * logits.shape[-1]
        words = logits.masked_fill(torch.isin(columns, marks), torch.finfo(logits.dtype).min)
        span = ~torch.isin(target, marks)
        return {"lm_span_acc": (((vocab_parallel_argmax(words) == target) & span).sum(), span.sum())}

    def baselines(self, batch, terms, most_frequent):
        import torch

        labels = batch["labels"]
        span = (labels != -100) & ~torch.isin(labels, torch.tensor(markers(self.cfg.data.paths[0]),
                                                                   device=labels.device))
        return {**super().baselines(batch, terms, most_frequent),
                "lm_span_unigram_acc": (((labels == most_frequent) & span).sum(), span.sum())}


OBJECTIVES = (SpanCorruption(),)
