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
  each block of perm_size (so the order is local to a block, and the same in every block).
"""
from __future__ import annotations

import numpy as np

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
