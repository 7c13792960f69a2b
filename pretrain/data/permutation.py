"""XLNet's permutation language modelling on numpy (Yang et al. 2019; the released pretraining code's
`_sample_mask` and `_local_perm`):

- `span_mask(word_start, goal, rng)`: the tokens to predict, `goal` of them: whole-word n-grams, n in 1..5 with
  probability proportional to 1/n, each inside a context of alpha * n tokens (alpha = 6: about 1/6 of the tokens),
  then single tokens at random until the goal is reached;
- `factorisation(targets, functional, order)`: the attention pattern of one sampled factorisation order. Tokens that
  are neither predicted nor functional ([SEP], [CLS]) come first in every order: everyone sees them, they see no
  target. The predicted and functional tokens follow in `order`'s ranking; a target sees the targets ranked before it,
  never itself; a functional token also sees itself. `perm_mask[i, j]`: True where i may not see j (HF's convention).
- `local_order(length, perm_size, rng)`: XLNet's ranking: one random permutation of perm_size positions, applied to
  each block of perm_size (so the order is local to a block, and the same in every block);
- `PermutationSamples`: the sample source.
"""
from __future__ import annotations

import numpy as np

from pretrain.data.gpt import GPTDataset
from pretrain.data.indexes import Stream, rng

MAX_GRAM, ALPHA, BETA = 5, 6, 1


def span_mask(word_start: np.ndarray, goal: int, rng: np.random.Generator, max_gram: int = MAX_GRAM,
              alpha: int = ALPHA, beta: int = BETA) -> np.ndarray:
    """[len(word_start)] bool, exactly min(goal, length) True: the positions to predict."""
    length = len(word_start)
    mask = np.zeros(length, dtype=bool)
    starts = np.flatnonzero(word_start) if word_start.any() else np.arange(length)
    ends = np.append(starts[1:], length)  # each word's end: the next word's start
    grams = np.arange(1, max_gram + 1)
    p = 1.0 / grams
    p /= p.sum()
    chosen, at = 0, 0
    while chosen < goal:
        n = int(rng.choice(grams, p=p))
        context = n * alpha // beta
        left = int(rng.integers(context))
        first = np.searchsorted(starts, at + left)  # the first whole word at or after the left context
        if first + n > len(starts):
            break
        begin, end = starts[first], ends[first + n - 1]
        end = min(end, begin + goal - chosen)  # the last span is cut at the goal
        mask[begin:end] = True
        chosen += end - begin
        at = end + context - left
    free = np.flatnonzero(~mask)
    mask[rng.choice(free, min(goal - chosen, len(free)), replace=False)] = True
    return mask


def local_order(length: int, perm_size: int, rng: np.random.Generator) -> np.ndarray:
    """[length] the rank of each position in the factorisation order (XLNet's `_local_perm` index): within each block
    of perm_size positions, the same random permutation."""
    if length % perm_size:
        raise ValueError(f"perm_size {perm_size} does not divide the sequence length {length}")
    blocks = np.arange(length).reshape(-1, perm_size).T  # [perm_size, blocks]
    return blocks[rng.permutation(perm_size)].T.reshape(-1)


def factorisation(targets: np.ndarray, functional: np.ndarray, order: np.ndarray) -> np.ndarray:
    """[s, s] bool perm_mask: True where position i may not see position j."""
    visible_to_all = ~targets & ~functional
    rank = np.where(visible_to_all, -1, order)
    own = np.where(targets, rank, rank + 1)  # a target may not see itself, a functional token may
    return (own[:, None] <= rank[None, :]) & ~visible_to_all[None, :]


class PermutationSamples(GPTDataset):
    """XLNet's samples over documents `docs` of the dataset at `path`, each from its own generator
    (`indexes.rng(SAMPLE, seed, epoch, index)`): a window of seq_len - 3 tokens of the packed document stream cut into
    A and B; half the time B is the rest of the window, else the start of another window (XLNet's
    50% consecutive); laid out A [SEP] B [SEP] [CLS] with segments 0, 1 and 2; `num_predict` tokens of A and B chosen
    by `span_mask` and put in a factorisation order (`local_order` over blocks of `perm_size`). Fields: input_ids,
    token_type_ids, perm_mask [seq_len, seq_len] (True: may not see), targets [num_predict] (positions, ascending)
    and labels (their tokens). A and B meet at a sentence start where the window holds one (as XLNet's
    `_split_a_and_b`), else at a word start.

    With `reuse_len` R (XLNet's memory): the window's first R tokens come before A, in segment 0; windows start every
    R tokens, so that the next window of a stream (`streams`) begins where this one's reused part ends, and the
    memory keeps the reused part's states. The reused part is a factorisation of its own (half the predicted tokens,
    XLNet's split), blind to the rest; the rest sees all of it."""

    roles = ("eod", "sep", "cls"), "XLNet's A [SEP] B [SEP] [CLS] samples of packed documents"

    def __init__(self, path: str, seq_len: int, num_predict: int, perm_size: int, *, reuse_len: int = 0,
                 streams: int = 0, seed: int = 1234, docs=None, cache_dir: str | None = None):
        super().__init__(path, seq_len - 3, seed=seed, docs=docs, cache_dir=cache_dir, pack=True,
                         stride=reuse_len or None, streams=streams)
        self.length, self.num_predict, self.perm_size, self.reuse = seq_len, num_predict, perm_size, reuse_len
        self.sep, self.cls = self.corpus.special_ids["sep"], self.corpus.special_ids["cls"]

    def _word_start(self, doc: int) -> np.ndarray:
        starts = self.corpus.word_start(doc)
        return starts if len(starts) else np.ones(len(self.corpus.tokens(doc)), np.uint8)  # no word structure

    def _sentence_start(self, doc: int) -> np.ndarray:
        flags = np.zeros(len(self.corpus.tokens(doc)), np.uint8)
        flags[self.corpus.sentence_starts(doc)] = 1  # none without sentence structure
        return flags

    def sample(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        g = rng(Stream.SAMPLE, self.seed, epoch, index)
        n, r = self.seq_len, self.reuse  # the reused part, A and B together; the reused part
        tokens = self.packed(epoch, index, self.corpus.tokens, self.eod)[:n]
        starts = self.packed(epoch, index, self._word_start, 1)[:n].astype(bool)
        sentences = np.flatnonzero(self.packed(epoch, index, self._sentence_start, 0)[r + 1:n]) + r + 1
        words = np.flatnonzero(starts[r + 1:]) + r + 1
        cuts = sentences if len(sentences) else words  # XLNet cuts between sentences; else between words
        cut = int(g.choice(cuts)) if len(cuts) else (r + n) // 2
        if g.random() >= 0.5:  # B from another window
            other = int(g.integers(len(self)))
            tokens[cut:] = self.packed(epoch, other, self.corpus.tokens, self.eod)[:n - cut]
            starts[cut:] = self.packed(epoch, other, self._word_start, 1)[:n - cut].astype(bool)
        starts[[r, cut]] = True
        if r:  # XLNet's split of the predictions: the larger half in the reused part
            predicted = np.concatenate([span_mask(starts[:r], self.num_predict - self.num_predict // 2, g),
                                        span_mask(starts[r:], self.num_predict // 2, g)])
        else:
            predicted = span_mask(starts, self.num_predict, g)
        layout = np.concatenate([np.arange(cut), np.arange(cut, n) + 1])  # where A's and B's tokens go
        input_ids = np.empty(self.length, np.int64)
        input_ids[layout], input_ids[[cut, n + 1, n + 2]] = tokens, [self.sep, self.sep, self.cls]
        segments = np.concatenate([np.zeros(cut + 1), np.ones(n - cut + 1), [2]]).astype(np.int64)
        functional = np.zeros(self.length, bool)
        functional[[cut, n + 1, n + 2]] = True
        targets = np.zeros(self.length, bool)
        targets[layout[predicted]] = True
        perm_mask = np.zeros((self.length, self.length), bool)
        perm_mask[:r, r:] = True  # the reused part is blind to the rest, which sees all of it
        for part in (slice(0, r), slice(r, None)) if r else (slice(None),):
            size = len(targets[part])
            order = local_order(size, self.perm_size or size, g)
            perm_mask[part, part] = factorisation(targets[part], functional[part], order)
        where = np.flatnonzero(targets)
        return {"input_ids": input_ids, "token_type_ids": segments, "perm_mask": perm_mask, "targets": where,
                "labels": input_ids[where], **self.position(epoch, index)}
