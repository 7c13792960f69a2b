"""BERT / ERNIE masked-LM samples from the stored sentence boundaries.

Pair tasks:
- nsp (BERT's next sentence prediction): [CLS] A [SEP] B [SEP]; A is the first sentences of a run of sentences
  of one document, B the rest of the run (next_sentence_label 0) or, with probability 1/2 or when the run is one
  sentence, sentences of another random document (label 1).
- sop (ALBERT's sentence order prediction): B always follows A; with probability 1/2 they are swapped (label 1).
  A run of one sentence is split at a word boundary.
- next (UniLM's segments): B always follows A, never swapped; no label. A run of one sentence is split at a word
  boundary.
- none (RoBERTa FULL-SENTENCES): [CLS] S1 S2 ... [SEP]: contiguous whole sentences up to seq_len, across
  document boundaries with a [SEP] between documents; no next_sentence_label.

Runs are built once per dataset (`indexes.pair_chunks` / `packed_chunks`, with BERT's short_seq_prob) and
read in a seeded order per epoch; the A/B split, the random document, the truncation of the longer
segment (from the front or the back at random, as create_pretraining_data) and the masking are drawn
from the sample's own generator `rng(SAMPLE, seed, epoch, index)`.
"""
from __future__ import annotations

from functools import cached_property

import numpy as np

from data_prep.text import has
from pretrain.data.indexes import Stream, packed_chunks, pair_chunks, rng, shuffle
from pretrain.data.source import CorpusSource

PAIR_TASKS = ("nsp", "sop", "next", "none")


class BertDataset(CorpusSource):
    """Masked-LM samples of seq_len tokens over documents `docs` (default: all) of the dataset at `path`."""

    def __init__(self, path: str, seq_len: int, masker, *, pair_task: str = "nsp", short_seq_prob: float = 0.1,
                 seed: int = 1234, docs=None, cache_dir: str | None = None):
        if pair_task not in PAIR_TASKS:
            raise ValueError(f"pair task {pair_task!r}: expected one of {', '.join(PAIR_TASKS)}")
        if seq_len < 5:
            raise ValueError(f"seq_len {seq_len} is too short for [CLS] A [SEP] B [SEP]")
        super().__init__(path, seed=seed, docs=docs, cache_dir=cache_dir)
        self.require(*self._structure(masker, pair_task))
        self._words = has(self.corpus.structure, "words")
        if pair_task == "nsp" and len(self.docs) < 2:
            raise ValueError(f"{path}: next sentence prediction needs two documents at least")
        self.seq_len, self.masker, self.pair_task = seq_len, masker, pair_task
        self.short_seq_prob = short_seq_prob
        self.max_tokens = seq_len - (2 if pair_task == "none" else 3)
        self.special = self.corpus.special_ids
        self._len = len(self.chunks)
        if not self._len:
            raise ValueError(f"{path}: no document holds two tokens")

    def __len__(self) -> int:
        return self._len

    @staticmethod
    def _structure(masker, pair_task: str) -> tuple[str, str]:
        """(the dataset structure these samples need, what needs it)."""
        if pair_task in ("sop", "next") and masker.structure == "sentences":  # a one-sentence run splits at a word
            return "words", "sentence-order prediction" if pair_task == "sop" else "a pair cut inside a sentence"
        return masker.structure, f"{masker.unit} masking"

    @cached_property
    def chunks(self) -> np.ndarray:
        """(C, 3) [first sentence, end sentence, target length] of every run of sentences."""
        if self.pair_task == "none":
            return self.index("bert-packed", lambda: packed_chunks(self.sentences, self.max_tokens),
                              max_tokens=self.max_tokens)
        return self.index("bert-pairs", lambda: pair_chunks(self.sentences, self.max_tokens, self.short_seq_prob,
                                                            self.seed),
                          max_tokens=self.max_tokens, short_seq_prob=self.short_seq_prob, seed=self.seed)

    def _build_epoch(self, epoch: int) -> np.ndarray:
        return self.index("bert-shuffle", lambda: shuffle(len(self), Stream.SHUFFLE, self.seed, epoch),
                          seed=self.seed, epoch=epoch, n=len(self))

    def sample(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        g = rng(Stream.SAMPLE, self.seed, epoch, index)
        lo, hi, target = (int(x) for x in self.chunks[self.epoch_index(epoch)[index]])
        if self.pair_task == "none":
            pieces, label = self._packed(lo, hi), None
        else:
            pieces, label = self._pair(g, lo, hi, target)
        ids, types, words, spans, length = self._layout(pieces)
        ids, labels = self.masker(g, ids, words, spans)
        out = {"input_ids": ids, "token_type_ids": types,
               "attention_mask": (np.arange(self.seq_len) < length).astype(np.int64), "labels": labels}
        if label is not None:
            out["next_sentence_label"] = np.array(label, dtype=np.int64)
        return out

    # ------------------------------------------------------------------------------- segments
    # A segment is (document id, first token, end token); pieces are [(segment, token type), ...].

    def _pair(self, g, lo: int, hi: int, target: int):
        doc_pos, first, end = self.sentences
        doc = int(self.docs[doc_pos[lo]])
        a0, b1 = int(first[lo]), int(end[hi - 1])
        if hi - lo >= 2:
            cut = int(first[g.integers(lo + 1, hi)])
        elif self.pair_task in ("sop", "next"):
            words = a0 + 1 + np.flatnonzero(self.corpus.word_start(doc)[a0 + 1:b1])
            cut = int(g.choice(words)) if len(words) else int(g.integers(a0 + 1, b1))
        else:
            cut = b1
        a, b, label = (doc, a0, cut), (doc, cut, b1), 0
        if self.pair_task == "nsp" and (cut == b1 or g.random() < 0.5):
            b, label = self._random_segment(g, int(doc_pos[lo]), target - (cut - a0)), 1
        elif self.pair_task == "sop" and g.random() < 0.5:
            a, b, label = b, a, 1
        a, b = _truncate_pair(g, a, b, self.max_tokens)
        return [(a, 0), (b, 1)], None if self.pair_task == "next" else label

    def _random_segment(self, g, pos: int, target: int) -> tuple[int, int, int]:
        """Whole sentences of another document, from a random one on, until `target` tokens."""
        doc_pos, first, end = self.sentences
        other = int(g.integers(len(self.docs) - 1))
        other += other >= pos
        s0, s1 = np.searchsorted(doc_pos, [other, other + 1])
        j = int(g.integers(s0, s1))
        b0 = int(first[j])
        k = min(j + int(np.searchsorted(end[j:s1], b0 + max(target, 1))), s1 - 1)
        return int(self.docs[other]), b0, int(end[k])

    def _packed(self, lo: int, hi: int):
        doc_pos, first, end = (r[lo:hi] for r in self.sentences)
        cuts = np.flatnonzero(np.diff(doc_pos)) + 1
        segments = [(int(self.docs[doc_pos[i]]), int(first[i]), int(end[j - 1]))
                    for i, j in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [hi - lo]]))]
        over = sum(t1 - t0 for _, t0, t1 in segments) + len(segments) - 1 - self.max_tokens
        doc, t0, t1 = segments[-1]
        segments[-1] = (doc, t0, t1 - max(over, 0))  # over > 0 only for one sentence longer than max_tokens
        return [(s, 0) for s in segments]

    def _layout(self, pieces):
        """[CLS] piece [SEP] piece [SEP] ... padded to seq_len: ids, token types, word starts, the
        masker's spans in sequence positions, and the unpadded length."""
        ids = np.full(self.seq_len, self.special["pad"], dtype=np.int64)
        types = np.zeros(self.seq_len, dtype=np.int64)
        words = np.zeros(self.seq_len, dtype=bool)
        spans = [np.zeros((0, 2), dtype=np.int64)]
        ids[0], at = self.special["cls"], 1
        for (doc, t0, t1), kind in pieces:
            n = t1 - t0
            ids[at:at + n] = self.corpus.tokens(doc)[t0:t1]
            if self._words:
                words[at:at + n] = self.corpus.word_start(doc)[t0:t1]
            types[at:at + n + 1] = kind
            for name in self.masker.span_kinds:
                s = np.clip(getattr(self.corpus, f"{name}_spans")(doc), t0, t1).astype(np.int64)
                spans.append(s[s[:, 1] > s[:, 0]] - t0 + at)
            at += n
            ids[at] = self.special["sep"]
            at += 1
        return ids, types, words, np.concatenate(spans), at


def _truncate_pair(g, a, b, max_tokens: int):
    """Trim the longer segment one token at a time (ties: B) until both fit, each token from the front or
    the back with probability 1/2 (create_pretraining_data's truncate_seq_pair), in closed form."""
    (da, a0, a1), (db, b0, b1) = a, b
    la, lb = a1 - a0, b1 - b0
    na = min(la, max(max_tokens - lb, (max_tokens + 1) // 2))
    nb = min(lb, max_tokens - na)
    fa, fb = int(g.binomial(la - na, 0.5)), int(g.binomial(lb - nb, 0.5))
    return (da, a0 + fa, a0 + fa + na), (db, b0 + fb, b0 + fb + nb)
