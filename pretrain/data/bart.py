"""BART's denoising samples (Lewis et al. 2020, its best recipe: text infilling and sentence permutation), on numpy:

- a sample is a run of whole sentences of one document up to seq_len - 2 tokens (`indexes.pair_chunks`, no short
  runs); a longer first sentence is cut;
- sentence permutation: the run's sentences in a random order;
- text infilling (`infill`): span lengths drawn from Poisson(3) until they cover 30% of the tokens (the last one
  trimmed), each span of length k > 0 replaced by one mask token, each of length 0 inserting one;
- the encoder reads `<s> corrupted </s>`, the decoder predicts `<s> original </s>` from it shifted right after `</s>`
  (BART's decoder start); padding to seq_len, labels -100 there.

Every draw comes from the sample's own generator (`indexes.rng(SAMPLE, seed, epoch, index)`): the same sample under
any layout.
"""
from __future__ import annotations

from functools import cached_property

import numpy as np

from pretrain.data.indexes import Stream, pair_chunks, rng, shuffle
from pretrain.data.source import CorpusSource

RATIO, POISSON = 0.3, 3.0


def span_lengths(tokens: int, rng_: np.random.Generator, ratio: float = RATIO, mean: float = POISSON) -> np.ndarray:
    """Poisson(mean) lengths drawn until they add up to round(ratio x tokens) at least; the last one trimmed so that
    they add up to it exactly (zeros included: each is an insertion)."""
    goal = int(round(tokens * ratio))
    lengths, total = [], 0
    while total < goal:
        lengths.append(int(rng_.poisson(mean)))
        total += lengths[-1]
    if lengths:
        lengths[-1] -= total - goal
    return np.array(lengths, dtype=np.int64)


def infill(tokens: np.ndarray, rng_: np.random.Generator, mask: int, ratio: float = RATIO,
           mean: float = POISSON) -> np.ndarray:
    """Text infilling: each span of `span_lengths` (k > 0) starts at a distinct random token and becomes one `mask`
    (overlapping spans merge, each start left as a mask); each length-0 span inserts a `mask` at a random place."""
    n = len(tokens)
    lengths = span_lengths(n, rng_, ratio, mean)
    spans = lengths[lengths > 0][:n]
    starts = rng_.choice(n, size=len(spans), replace=False) if len(spans) else np.zeros(0, np.int64)
    cover = np.zeros(n + 1, dtype=np.int64)
    np.add.at(cover, starts, 1)
    np.add.at(cover, np.minimum(starts + spans, n), -1)
    hidden = np.cumsum(cover[:-1]) > 0
    first = np.zeros(n, dtype=bool)
    first[starts] = True
    out = np.where(first, mask, tokens)[~hidden | first]
    inserts = int((lengths == 0).sum())
    return np.insert(out, rng_.integers(0, len(out) + 1, inserts), mask) if inserts else out


class DenoisingDataset(CorpusSource):
    """BART's samples of seq_len tokens over documents `docs` (default: all) of the dataset at `path`: input_ids,
    attention_mask, labels, decoder_input_ids, decoder_attention_mask."""

    def __init__(self, path: str, seq_len: int, *, seed: int = 1234, docs=None, cache_dir: str | None = None,
                 ratio: float = RATIO, mean: float = POISSON, permute: bool = True):
        super().__init__(path, seed=seed, docs=docs, cache_dir=cache_dir)
        self.require("sentences", "sentence permutation")
        self.seq_len, self.max_tokens = seq_len, seq_len - 2
        self.ratio, self.mean, self.permute = ratio, mean, permute
        self.bos, self.eos, self.pad, self.mask = self.corpus.special(
            "cls", "eod", "pad", "mask", what="denoising samples (<s> text </s>, padded, noised with <mask>)")
        self._len = len(self.chunks)
        if not self._len:
            raise ValueError(f"{path}: no document holds two tokens")

    def __len__(self) -> int:
        return self._len

    @cached_property
    def chunks(self) -> np.ndarray:
        return self.index("bart-runs", lambda: pair_chunks(self.sentences, self.max_tokens, 0.0, self.seed),
                          max_tokens=self.max_tokens, short_seq_prob=0.0, seed=self.seed)

    def _build_epoch(self, epoch: int) -> np.ndarray:
        return self.index("bart-shuffle", lambda: shuffle(len(self), Stream.SHUFFLE, self.seed, epoch),
                          seed=self.seed, epoch=epoch, n=len(self))

    def sentences_of(self, epoch: int, index: int) -> list[np.ndarray]:
        """The tokens of each sentence of sample `index`'s run, the last cut to fit seq_len - 2 (a first one longer
        than that, alone)."""
        lo, hi, _ = (int(x) for x in self.chunks[self.epoch_index(epoch)[index]])
        doc_pos, first, end = (r[lo:hi] for r in self.sentences)
        tokens = self.corpus.tokens(int(self.docs[doc_pos[0]]))
        pieces, room = [], self.max_tokens
        for a, b in zip(first, end):
            pieces.append(tokens[a:a + min(int(b - a), room)])
            room -= len(pieces[-1])
        return [p for p in pieces if len(p)]

    def sample(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        g = rng(Stream.SAMPLE, self.seed, epoch, index)
        pieces = self.sentences_of(epoch, index)
        original = np.concatenate(pieces)
        order = g.permutation(len(pieces)) if self.permute else np.arange(len(pieces))
        corrupted = infill(np.concatenate([pieces[i] for i in order]), g, self.mask, self.ratio, self.mean)
        source = np.concatenate([[self.bos], corrupted[:self.max_tokens], [self.eos]])
        target = np.concatenate([[self.bos], original, [self.eos]])
        return {"input_ids": pad(source, self.seq_len, self.pad),
                "attention_mask": pad(np.ones_like(source), self.seq_len, 0),
                "labels": pad(target, self.seq_len, -100),
                "decoder_input_ids": pad(np.concatenate([[self.eos], target[:-1]]), self.seq_len, self.pad),
                "decoder_attention_mask": pad(np.ones_like(target), self.seq_len, 0)}


def pad(a: np.ndarray, length: int, value: int) -> np.ndarray:
    """`a` followed by `value` up to `length`, as int64."""
    out = np.full(length, value, dtype=np.int64)
    out[:len(a)] = a
    return out
