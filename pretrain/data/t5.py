"""T5's span corruption (Raffel et al. 2020, section 3.1.4), as its preprocessors compute it, on numpy:

- `lengths(seq_len)`: how many raw tokens a sample takes so that its corrupted input, with a sentinel per span and
  the end-of-sequence token, fills `seq_len` exactly, and how long its target then is (T5's `random_spans_helper`:
  568 raw tokens and 114 target tokens for 512 inputs at noise density 0.15 and mean span length 3);
- `noise_mask(length, rng)`: round(length x density) noise tokens in round(noise / mean span length) spans; the span
  lengths, and those of the runs of kept tokens between them, each a uniformly random split of their total into
  positive parts (T5's `random_spans_noise_mask`); a sample starts with kept tokens;
- `corrupt(tokens, mask, sentinels, eos)`: the input keeps the kept tokens and puts one sentinel in place of each span
  (`<extra_id_0>` first), the target is each sentinel followed by its span; both end with `eos`.

`SpanCorruption` is the sample source: the packed document stream (GPT-2's, documents separated by the
end-of-document token) cut into windows of the raw length, each corrupted with a noise mask drawn from the sample's
own generator (`indexes.rng(SAMPLE, seed, epoch, index)`): the same sample under any layout.
"""
from __future__ import annotations

import numpy as np

from pretrain.data.gpt import GPTDataset
from pretrain.data.indexes import Stream, rng

DENSITY, MEAN_SPAN = 0.15, 3.0


def counts(length: int, density: float = DENSITY, mean_span: float = MEAN_SPAN) -> tuple[int, int]:
    """(noise tokens, noise spans) of a sample of `length` raw tokens."""
    noise = min(max(int(round(length * density)), 1), length - 1)
    return noise, max(int(round(noise / mean_span)), 1)


def lengths(seq_len: int, density: float = DENSITY, mean_span: float = MEAN_SPAN) -> tuple[int, int]:
    """(raw tokens per sample, target length) for corrupted inputs of exactly `seq_len` tokens (eos included)."""
    def sizes(raw: int) -> tuple[int, int]:
        noise, spans = counts(raw, density, mean_span)
        return raw - noise + spans + 1, noise + spans + 1

    raw = seq_len - 1
    while sizes(raw + 1)[0] <= seq_len:
        raw += 1
    inputs, targets = sizes(raw)
    if inputs != seq_len:
        raise ValueError(f"data.seq_len={seq_len}: no raw length makes span-corrupted inputs of exactly that many "
                         f"tokens at noise density {density} and mean span length {mean_span}; use another seq_len")
    return raw, targets


def _split(total: int, parts: int, rng: np.random.Generator) -> np.ndarray:
    """`total` as `parts` positive integers, every such split equally likely."""
    cuts = np.sort(rng.choice(total - 1, parts - 1, replace=False) + 1) if parts > 1 else np.zeros(0, np.int64)
    return np.diff(np.concatenate([[0], cuts, [total]]))


def noise_mask(length: int, rng: np.random.Generator, density: float = DENSITY,
               mean_span: float = MEAN_SPAN) -> np.ndarray:
    """[length] bool, True at the tokens to corrupt: alternating runs of kept and noise tokens, kept first."""
    noise, spans = counts(length, density, mean_span)
    noise_lengths = _split(noise, spans, rng)
    kept_lengths = _split(length - noise, spans, rng)
    runs = np.stack([kept_lengths, noise_lengths], axis=1).reshape(-1)
    return np.repeat(np.tile([False, True], spans), runs)


def corrupt(tokens: np.ndarray, mask: np.ndarray, sentinels: np.ndarray, eos: int) -> tuple[np.ndarray, np.ndarray]:
    """(input, target) of `tokens` under noise `mask` (T5's noise_span_to_unique_sentinel and its inverse): the input
    shows each run of kept tokens and a sentinel for the noise span after it; the target a sentinel for each run of
    kept tokens and the noise span after it. With kept tokens first (`noise_mask`'s), span k's sentinel is the same
    on both sides: <extra_id_k> (`sentinels[k]`). Both end with `eos`."""
    def replaced(hidden):  # each run of `hidden` tokens as one sentinel, numbered in order
        first = hidden & ~np.concatenate([[False], hidden[:-1]])
        runs = int(first.sum())
        if runs > len(sentinels):
            raise ValueError(f"{runs} noise spans but {len(sentinels)} sentinels; give the tokenizer more sentinels "
                             f"or use a shorter data.seq_len")
        shown = np.where(first, sentinels[np.maximum(np.cumsum(first) - 1, 0)], tokens)
        return np.concatenate([shown[~hidden | first], [eos]])

    return replaced(mask), replaced(~mask)


class SpanCorruption(GPTDataset):
    """T5's samples over documents `docs` of the dataset at `path`: `input_ids` [seq_len], `labels` [target length]
    (the target, ending with the end-of-sequence token) and `decoder_input_ids` (the target shifted right after the
    padding id, T5's decoder start). `sentinels[k]` is `<extra_id_k>`'s id.

    Every sample predicts as many tokens, whatever its documents' lengths: its window of the packed stream is always
    full, its noise and spans are counted from that length alone, and every target token is a label (none -100). So
    the loss's per-micro-batch mean is its global-batch mean, and T5's layout runs cannot tell them apart
    (tests/test_data_t5.py checks every sample of an epoch; tests/test_fidelity.py's EQUAL_COUNTS)."""

    roles = ("eod", "pad"), "T5's targets (each ended by </s>; <pad> starts the decoder)"

    def __init__(self, path: str, seq_len: int, sentinels, *, seed: int = 1234, docs=None,
                 cache_dir: str | None = None, density: float = DENSITY, mean_span: float = MEAN_SPAN):
        self.raw, self.target_len = lengths(seq_len, density, mean_span)
        super().__init__(path, self.raw, seed=seed, docs=docs, cache_dir=cache_dir, pack=True)
        self.pad = self.corpus.special_ids["pad"]
        self.sentinels, self.density, self.mean_span = np.asarray(sentinels, dtype=np.int64), density, mean_span

    def sample(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        tokens = super().sample(epoch, index)["input_ids"]  # the window's first `raw` tokens: windows do not overlap
        mask = noise_mask(len(tokens), rng(Stream.SAMPLE, self.seed, epoch, index), self.density, self.mean_span)
        inputs, targets = corrupt(tokens, mask, self.sentinels, self.eod)
        return {"input_ids": inputs, "labels": targets,
                "decoder_input_ids": np.concatenate([[self.pad], targets[:-1]])}
