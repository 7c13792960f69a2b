"""Dynamic masked-LM masking (RoBERTa): decided per sample from that sample's generator, never stored.

The maskable tokens (all but [PAD] [CLS] [SEP] [MASK] and end-of-document) are grouped into units, which
are chosen in random order, skipping any that would overshoot, until round(mask_prob * maskable tokens)
tokens (at most `max_predictions`) are chosen, as BERT's create_pretraining_data does. Each chosen token
becomes [MASK] (80%), a random token (10%) or stays (10%). Units, by strategy:

- token: single tokens (BERT)
- whole_word: words: a token with word_start = 1 and the tokens with 0 after it
- span: runs of whole words with lengths from a geometric distribution clipped at max_span_words (SpanBERT)
- ngram: runs of 1 to 3 whole words, n drawn with probability proportional to 1/n (ALBERT: 6/11, 3/11, 2/11)
- correction: MacBERT's MLM as correction: runs of 1 to 4 whole words (40/30/20/10%), each chosen word replaced
  by a similar word of as many tokens (`similar`, from a similar-words file; a random word when none is known)
  80% of the time, by a random word 10%, kept 10%; [MASK] never appears
- knowledge: phrase and entity spans of the dataset as whole units, other tokens as words (ERNIE 1.0);
  `knowledge_level` stages it: "token" (basic masking), "phrase" or "entity" (phrases and entities)
"""
from __future__ import annotations

import os

import numpy as np

STRATEGIES = {
    "token": "independent tokens",
    "whole_word": "all tokens of a word together",
    "span": "random contiguous spans of words (SpanBERT)",
    "ngram": "n-grams of 1-3 whole words, n drawn with probability 1/n normalised (ALBERT)",
    "correction": "MacBERT: n-grams of 1-4 whole words replaced by similar words (data.similar_words), never [MASK]",
    "knowledge": "phrase and entity spans from the dataset (ERNIE 1.0 knowledge masking)",
}
KNOWLEDGE_LEVELS = {"token": (), "phrase": ("phrase",), "entity": ("phrase", "entity")}
IGNORE = -100  # label of positions that are not predicted
NGRAM_P = {"ngram": (1 / np.arange(1, 4)) / (1 / np.arange(1, 4)).sum(),  # ALBERT
           "correction": np.array([0.4, 0.3, 0.2, 0.1])}  # MacBERT


def check(cfg, need) -> None:
    """The masking options' rules (every objective that masks reads data.masking): similar words only for MacBERT's
    correction masking, from a file that exists."""
    d = cfg.data
    need(not d.similar_words or d.masking == "correction",
         f"data.similar_words is set but data.masking={d.masking}; similar words replace masked words only with "
         "data.masking=correction (MacBERT): set it, or remove data.similar_words")
    need(not d.similar_words or os.path.isfile(d.similar_words),
         f"data.similar_words={d.similar_words} not found; give a UTF-8 file of words and their similar words")


class Masker:
    """Masks a laid-out sequence in place: `ids, labels = masker(rng, ids, word_start, spans)`."""

    def __init__(self, special_ids: dict, vocab_size: int, *, strategy: str = "token", mask_prob: float = 0.15,
                 max_predictions: int | None = None, knowledge_level: str = "entity", span_p: float = 0.2,
                 max_span_words: int = 10, mask_fraction: float = 0.8, random_fraction: float = 0.1,
                 similar: SimilarWords | None = None, where: str = "the dataset"):
        from data_prep.tokenizer import role_ids

        if strategy not in STRATEGIES:
            raise ValueError(f"masking strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")
        if knowledge_level not in KNOWLEDGE_LEVELS:
            raise ValueError(f"knowledge level {knowledge_level!r}: expected one of {', '.join(KNOWLEDGE_LEVELS)}")
        self.mask_prob, self.max_predictions = mask_prob, max_predictions
        self.span_p, self.max_span_words = span_p, max_span_words
        self.mask_fraction, self.random_fraction = mask_fraction, random_fraction
        self.similar = similar if strategy == "correction" else None
        special = role_ids(special_ids, ("pad", "cls", "sep", "mask", "eod"), f"{strategy} masking", where)
        self.mask_id = special_ids["mask"]
        self.unmaskable = np.zeros(vocab_size, dtype=bool)  # by token id
        self.unmaskable[special] = True
        self.random_ids = np.setdiff1d(np.arange(vocab_size), [i for i in special_ids.values() if i is not None])
        level = knowledge_level if strategy == "knowledge" else "token"
        self.span_kinds = KNOWLEDGE_LEVELS[level]  # which of the dataset's spans __call__ needs
        self.unit = "token" if strategy == "knowledge" and level == "token" else strategy
        # what the dataset must record (data_prep build --structure) for these units
        self.structure = "full" if self.span_kinds else "sentences" if self.unit == "token" else "words"

    def __call__(self, rng: np.random.Generator, ids: np.ndarray, word_start: np.ndarray,
                 spans=()) -> tuple[np.ndarray, np.ndarray]:
        """Mask int64 `ids` in place; `word_start` is aligned with it, `spans` are (k, 2) [start, end)
        positions of the `span_kinds` spans. Returns (ids, labels), labels IGNORE where not predicted."""
        maskable = ~self.unmaskable[ids]
        starts = self._unit_starts(rng, maskable, word_start.astype(bool), spans)
        unit = np.cumsum(starts)[maskable] - 1  # unit of each maskable token
        sizes = np.bincount(unit)
        budget = max(1, round(len(unit) * self.mask_prob))
        if self.max_predictions is not None:
            budget = min(budget, self.max_predictions)
        where = np.flatnonzero(maskable)[_choose(sizes, rng.permutation(len(sizes)), budget)[unit]]
        labels = np.full(len(ids), IGNORE, dtype=np.int64)
        labels[where] = ids[where]
        if self.unit == "correction":
            return self._correct(rng, ids, where, word_start), labels
        r = rng.random(len(where))
        ids[where[r < self.mask_fraction]] = self.mask_id
        rand = where[(r >= self.mask_fraction) & (r < self.mask_fraction + self.random_fraction)]
        ids[rand] = self.random_ids[rng.integers(len(self.random_ids), size=len(rand))]
        return ids, labels

    def _unit_starts(self, rng, maskable: np.ndarray, word_start: np.ndarray, spans) -> np.ndarray:
        """True where a unit starts, among the maskable positions; every run of maskable tokens starts one."""
        after_gap = maskable & ~np.concatenate([[False], maskable[:-1]])
        if self.unit == "token":
            return maskable
        words = (word_start & maskable) | after_gap
        if self.unit == "whole_word":
            return words
        if self.unit in ("span", "ngram", "correction"):  # consecutive runs of words, each a unit
            at = np.flatnonzero(words)
            lengths = (np.minimum(rng.geometric(self.span_p, size=len(at)), self.max_span_words) if self.unit == "span"
                       else rng.choice(len(NGRAM_P[self.unit]), size=len(at), p=NGRAM_P[self.unit]) + 1)
            first = np.cumsum(lengths) - lengths
            starts = np.zeros_like(words)
            starts[at[first[first < len(at)]]] = True
            return starts | after_gap
        n = len(maskable)  # knowledge: a phrase or entity is one unit; overlapping spans merge
        spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
        inside = np.cumsum(np.bincount(spans[:, 0] + 1, minlength=n + 1) - np.bincount(spans[:, 1], minlength=n + 1))
        edges = np.zeros(n + 1, dtype=bool)
        edges[spans.ravel()] = True
        return ((words | edges[:n]) & (inside[:n] == 0) & maskable) | after_gap


    def _correct(self, rng, ids: np.ndarray, where: np.ndarray, word_start: np.ndarray) -> np.ndarray:
        """MacBERT: each chosen word (its chosen tokens, cut at word starts) becomes a similar word of as many
        tokens (80%; a random one when none is known), a random word (10%) or stays (10%)."""
        cut = np.flatnonzero(word_start[where[1:]] | (np.diff(where) > 1)) + 1
        for word in np.split(where, cut):
            r = rng.random()
            if r >= self.mask_fraction + self.random_fraction:
                continue
            choice = self.similar.pick(rng, ids[word]) if self.similar and r < self.mask_fraction else None
            if choice is None:
                choice = self.random_ids[rng.integers(len(self.random_ids), size=len(word))]
            ids[word] = choice
        return ids


class SimilarWords:
    """Similar words by token ids: a word's tokens -> the token arrays of its similar words with as many tokens,
    from a file with one word per line followed by its similar words (whitespace-separated: synonyms, embedding
    neighbours). Each word is encoded as it appears at the start of a text, after a space and inside running text
    (no space, e.g. Chinese), so every form is found in samples."""

    def __init__(self, path: str, tokenizer):
        self.table: dict[tuple[int, ...], list[np.ndarray]] = {}
        with open(path, encoding="utf-8") as f:
            rows = [line.split() for line in f if line.strip()]
        words = sorted({w for row in rows for w in row})
        for prefix in ("", " ", "\u3002"):  # text start; after a space; inside text (after a CJK full stop)
            encoded = dict(zip(words, encode_after(tokenizer, prefix, words)))
            for word, *similar in rows:
                key = encoded[word]
                if key is None:
                    continue
                same = [np.array(encoded[s]) for s in similar if encoded[s] is not None and len(encoded[s]) == len(key)
                        and encoded[s] != key]
                if same:
                    self.table.setdefault(key, []).extend(same)

    def __len__(self) -> int:
        return len(self.table)

    def pick(self, rng, tokens: np.ndarray) -> np.ndarray | None:
        choices = self.table.get(tuple(tokens.tolist()))
        return choices[int(rng.integers(len(choices)))] if choices else None


def encode_after(tokenizer, prefix: str, words: list[str]) -> list[tuple[int, ...] | None]:
    """Each word's token ids as they stand after `prefix` in running text: from the first token that reaches into
    the word (a token that also holds the space before it, as GPT-2's "Ġword", or a zero-width one, as
    sentencepiece's lone "▁", belongs to the word, as data_prep assigns it); None where a token straddles a
    non-space prefix and the word."""
    ids, counts, starts, ends = tokenizer.encode([prefix + w for w in words])
    out, first, at = [], 0, len(prefix)
    for n in counts.tolist():
        t, b, e = ids[first:first + n], starts[first:first + n], ends[first:first + n]
        first += n
        reach = np.flatnonzero((e > at) | ((b == at) & (e == at)))
        i = int(reach[0]) if len(reach) else n
        straddles = i < n and b[i] < at and not prefix.isspace()
        out.append(None if i == n or straddles else tuple(t[i:].tolist()))
    return out


def _choose(sizes: np.ndarray, order: np.ndarray, budget: int) -> np.ndarray:
    """Units chosen walking `order` and taking each unit that still fits the budget (BERT's loop),
    a vectorised prefix at a time."""
    chosen = np.zeros(len(sizes), dtype=bool)
    while budget > 0:
        order = order[sizes[order] <= budget]
        if not len(order):
            break
        take = np.searchsorted(np.cumsum(sizes[order]), budget, side="right")
        chosen[order[:take]] = True
        budget -= int(sizes[order[:take]].sum())
        order = order[take:]
    return chosen
