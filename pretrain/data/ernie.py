"""ERNIE 2.0 continual multi-task samples (Sun et al. 2020) built from unlabeled text.

Each sample belongs to one task, drawn with the sampling weights of the stage its training step falls in
(`ernie.stages`: stage k lists the tasks trained together from then on; evaluation samples use the stage of
the step being evaluated). Every sample carries the fields
of all tasks, -100 where a task does not apply, so a batch can mix tasks:

    knowledge_masking        MLM with phrase/entity units (labels)                        word-aware
    capitalization           does the word start with a capital? (token_labels)           word-aware
    token_document_relation  does the word occur elsewhere in its document? (token_labels) word-aware
    sentence_reordering      which permutation shuffled the 1-3 pieces? (seq_label)       structure-aware
    sentence_distance        adjacent / same document / other document (seq_label)        structure-aware

The task-type embedding id is the task's group: 0 word-aware, 1 structure-aware, 2 semantic-aware.
"""
from __future__ import annotations

import numpy as np

from data_prep.dataset import Corpus
from pretrain.config import ERNIE_TASKS, USER_LABELED
from pretrain.data.pipeline import BertSamples, _bert_layout, _truncate, sentence_range, unit_starts
from pretrain.models.ernie_heads import PERMUTATIONS, TOKEN_TASKS

TASKS = list(ERNIE_TASKS)
TASK_TYPE = {"knowledge_masking": 0, "capitalization": 0, "token_document_relation": 0,
             "sentence_reordering": 1, "sentence_distance": 1, "discourse_relation": 2, "ir_relevance": 2}


class ErnieSamples(BertSamples):
    def __init__(self, corpus: Corpus, docs: np.ndarray, cfg, eval_step: int | None = None):
        data = cfg.data
        super().__init__(corpus, docs, _with(data, masking="knowledge", objective="mlm"), cfg.seed)
        self.stages, self.batch, self.eval_step = cfg.ernie, cfg.train.global_batch_size, eval_step
        for stage in cfg.ernie.stages:
            for task in stage.tasks:
                if task in USER_LABELED:
                    raise NotImplementedError(f"ERNIE task {task} (labelled data) is not implemented yet")
        tok = corpus.tokenizer()
        pieces = [tok.piece(i).lstrip("▁Ġ#") for i in range(corpus.vocab_size)]
        self.capital = np.array([p[:1].isupper() for p in pieces], dtype=bool)

    def _task(self, rng, position: int) -> str:
        step = self.eval_step if self.eval_step is not None else position // self.batch
        tasks = self.stages.stage_at(step).tasks
        weights = np.array(list(tasks.values()), dtype=np.float64)
        return list(tasks)[int(rng.choice(len(tasks), p=weights / weights.sum()))]

    def __call__(self, index: int, rng: np.random.Generator, position: int = 0) -> dict:
        task = self._task(rng, position)
        doc, first, last = (int(x) for x in self.chunks[index])
        seq_label = -100
        if task == "knowledge_masking":
            out = super().__call__(index, rng)
        elif task in TOKEN_TASKS:
            out = self._token_task(task, doc, first, last, rng)
        elif task == "sentence_reordering":
            out, seq_label = self._reordering(doc, first, last, rng)
        else:
            out, seq_label = self._distance(doc, first, last, rng)
        seq = self.cfg.seq_len
        out.setdefault("token_labels", np.full(seq, -100, dtype=np.int64))
        out.pop("next_sentence_label", None)
        out["seq_label"] = np.int64(seq_label)
        out["task"] = np.int64(TASKS.index(task))
        out["task_type_ids"] = np.full(seq, TASK_TYPE[task], dtype=np.int64)
        return out

    def _plain(self, a, b, rng) -> dict:
        """[CLS] A [SEP] (B [SEP]) with no masking."""
        out = _bert_layout(a, b, 0, self.special, _with(self.cfg, mask_prob=0.0, objective="mlm"),
                           self.corpus.vocab_size, rng)
        out["labels"][:] = -100
        return out

    def _token_task(self, task, doc, first, last, rng) -> dict:
        lo, hi = sentence_range(self.corpus, doc, first, last)
        hi = min(hi, lo + self.max_tokens + 1)
        tokens = self.corpus.tokens(doc)
        words = unit_starts(self.corpus, doc, "whole_word")[lo:hi].astype(bool)
        segment = tokens[lo:hi].astype(np.int64)
        if task == "capitalization":
            labels = self.capital[segment].astype(np.int64)
        else:
            elsewhere = np.concatenate([tokens[:lo], tokens[hi:]])
            labels = np.isin(segment, elsewhere).astype(np.int64)
        out = self._plain((segment, words), (np.zeros(0, np.int64), np.zeros(0, np.uint8)), rng)
        token_labels = np.full(self.cfg.seq_len, -100, dtype=np.int64)
        token_labels[1:1 + len(segment)] = np.where(words, labels, -100)  # one label per word, on its first token
        out["token_labels"] = token_labels
        return out

    def _reordering(self, doc, first, last, rng):
        n = last - first
        k = int(rng.integers(1, min(3, n) + 1))
        cuts = np.sort(rng.choice(np.arange(first + 1, last), size=k - 1, replace=False)) if k > 1 else []
        bounds = [first, *map(int, cuts), last]
        perm = tuple(int(i) for i in rng.permutation(k))
        pieces = [self._segment_plain(doc, bounds[i], bounds[i + 1]) for i in perm]
        tokens = np.concatenate([p[0] for p in pieces])[:self.max_tokens + 1]
        words = np.concatenate([p[1] for p in pieces])[:self.max_tokens + 1]
        out = self._plain((tokens, words), (np.zeros(0, np.int64), np.zeros(0, np.uint8)), rng)
        return out, PERMUTATIONS.index(perm)

    def _distance(self, doc, first, last, rng):
        """A = a sentence, B = the next one (0), another of the same document (1), or of another document (2)."""
        n_doc = len(self.corpus.sentence_starts(doc))
        a = int(rng.integers(first, last))
        label = int(rng.integers(3)) if n_doc > 2 else int(rng.choice([0, 2])) if n_doc == 2 else 2
        if label == 0 and a + 1 >= n_doc:
            a = n_doc - 2
        if label == 0:
            b_doc, b = doc, a + 1
        elif label == 1:
            b_doc = doc
            b = int(rng.choice([i for i in range(n_doc) if abs(i - a) > 1] or [a]))
            label = 1 if abs(b - a) > 1 else 0
        else:
            b_doc = doc
            while b_doc == doc and len(self.docs) > 1:
                b_doc = int(self.docs[rng.integers(len(self.docs))])
            b = int(rng.integers(len(self.corpus.sentence_starts(b_doc))))
        seg_a, seg_b = _truncate(self._segment_plain(doc, a, a + 1), self._segment_plain(b_doc, b, b + 1),
                                 self.max_tokens, rng)
        return self._plain(seg_a, seg_b, rng), label

    def _segment_plain(self, doc, first, last):
        lo, hi = sentence_range(self.corpus, doc, first, last)
        return self.corpus.tokens(doc)[lo:hi].astype(np.int64), self.corpus.word_start(doc)[lo:hi]


def _with(cfg, **changes):
    """A copy of a config section with some fields changed."""
    import dataclasses

    return dataclasses.replace(cfg, **changes)
