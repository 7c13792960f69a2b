"""ERNIE 2.0 continual multi-task samples (Sun et al. 2020) built from unlabeled text.

Each sample belongs to one task, drawn with the weights of the current stage (`ernie.stages`; the trainer
builds the stage's source when the stage begins). Every sample carries the fields of all tasks, -100
where a task does not apply, so one batch mixes tasks:

    knowledge_masking        MLM with phrase/entity units (labels)                           word-aware
    capitalization           does the word start with a capital letter? (token_labels)        word-aware
    token_document_relation  does the word's token occur elsewhere in the document? (token_labels)
    sentence_reordering      which permutation shuffled the 1-3 pieces? (seq_label)          structure-aware
    sentence_distance        next sentence / same document / another document (seq_label)   structure-aware
    discourse_relation       the class of a labelled sentence pair (seq_label)               semantic-aware
    ir_relevance             the relevance class of a labelled query-title pair (seq_label)  semantic-aware

The task-type embedding id is the task's group: 0 word-aware, 1 structure-aware, 2 semantic-aware.
"""
from __future__ import annotations

from functools import cached_property

import numpy as np

from data_prep.dataset import Corpus
from pretrain.data.bert import BertDataset, _truncate_pair
from pretrain.data.indexes import Stream, rng
from pretrain.data.ernie_tasks import PERMUTATIONS, TASK_SPECS, TASKS, TOKEN_TASKS, USER_LABELED


def labelled_corpus(task: str, path: str | None, main: str) -> Corpus:
    """The labelled dataset of a semantic-aware task (`data_prep build --label-field [--pair-field]`)."""
    if not path:
        raise ValueError(f"ERNIE task {task} needs labelled data: set ernie.task_data.{task}=PATH")
    corpus, reference = Corpus(path), Corpus(main)
    if corpus.manifest["tokenizer"]["sha256"] != reference.manifest["tokenizer"]["sha256"]:
        raise ValueError(f"ernie.task_data.{task}={path} was encoded with another tokenizer than {main}; build it "
                         f"with --tokenizer {main}")
    if corpus.manifest.get("num_labels", 0) < 2:
        raise ValueError(f"ernie.task_data.{task}={path} has no labels; build it with --label-field")
    return corpus


class ErnieDataset(BertDataset):
    """Runs of sentences of one document (BERT's pair runs), turned into a sample of one of `tasks`
    ({name: sampling weight}); knowledge masking uses `masker` (strategy "knowledge"); the semantic-aware
    tasks draw examples from their labelled datasets (`task_data`: {task: path})."""

    def __init__(self, path: str, seq_len: int, masker, *, tasks: dict[str, float], task_data: dict[str, str] | None = None,
                 seed: int = 1234, docs=None, cache_dir: str | None = None):
        self.labelled = {t: labelled_corpus(t, (task_data or {}).get(t), path) for t in tasks if t in USER_LABELED}
        super().__init__(path, seq_len, masker, pair_task="nsp", short_seq_prob=0.0, seed=seed, docs=docs,
                         cache_dir=cache_dir)
        self.tasks = list(tasks)
        weights = np.array(list(tasks.values()), dtype=np.float64)
        self.weights = weights / weights.sum()

    @staticmethod
    def _structure(masker, pair_task: str) -> tuple[str, str]:
        return "full", "ERNIE's knowledge masking stages"

    @cached_property
    def capital(self) -> np.ndarray:
        """Per token id: the piece's first letter is upper case."""
        tok = self.corpus.tokenizer()
        return np.array([tok.piece(i).lstrip("▁Ġ#")[:1].isupper() for i in range(self.corpus.vocab_size)])

    def sample(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        g = rng(Stream.SAMPLE, self.seed, epoch, index)
        task = self.tasks[int(g.choice(len(self.tasks), p=self.weights))]
        lo, hi, _ = (int(x) for x in self.chunks[self.epoch_index(epoch)[index]])
        doc_pos, first, end = self.sentences
        doc = int(self.docs[doc_pos[lo]])
        run = (doc, int(first[lo]), min(int(end[hi - 1]), int(first[lo]) + self.max_tokens + 1))
        token_labels, seq_label = np.full(self.seq_len, -100, dtype=np.int64), -100
        if task in self.labelled:
            return self._labelled(g, task)
        if task == "sentence_reordering":
            pieces, seq_label = self._reordering(g, doc, lo, hi)
        elif task == "sentence_distance":
            pieces, seq_label = self._distance(g, doc, int(doc_pos[lo]), lo, hi)
        else:
            pieces = [(run, 0)]
        ids, types, words, spans, length = self._layout(pieces)
        labels = np.full(self.seq_len, -100, dtype=np.int64)
        if task == "knowledge_masking":
            ids, labels = self.masker(g, ids, words, spans)
        elif task in TOKEN_TASKS:
            _, t0, t1 = run
            tokens = self.corpus.tokens(doc)
            if task == "capitalization":
                values = self.capital[ids]
            else:
                values = np.isin(ids, np.concatenate([tokens[:t0], tokens[t1:]]))
            token_labels = np.where(words, values.astype(np.int64), -100)  # one label per word, on its first token
        return self._fields(task, ids, types, length, labels, token_labels, seq_label)

    def _fields(self, task, ids, types, length, labels, token_labels, seq_label) -> dict[str, np.ndarray]:
        return {"input_ids": ids, "token_type_ids": types, "attention_mask": (np.arange(self.seq_len) < length)
                .astype(np.int64), "labels": labels, "token_labels": token_labels,
                "seq_label": np.array(seq_label, dtype=np.int64), "task": np.array(TASKS.index(task), dtype=np.int64),
                "task_type_ids": np.full(self.seq_len, TASK_SPECS[task].group, dtype=np.int64)}

    def _labelled(self, g, task: str) -> dict[str, np.ndarray]:
        """A random example of the task's labelled dataset: [CLS] A [SEP] B [SEP] (B from pair_start on)."""
        corpus = self.labelled[task]
        j = int(g.integers(len(corpus)))
        tokens, b = corpus.tokens(j).astype(np.int64), corpus.pair_start(j)
        a, bb = _truncate_pair(g, (0, 0, b or len(tokens)), (0, b or len(tokens), len(tokens)), self.max_tokens)
        seg_a, seg_b = tokens[a[1]:a[2]], tokens[bb[1]:bb[2]]
        ids = np.full(self.seq_len, self.special["pad"], dtype=np.int64)
        body = [self.special["cls"], *seg_a, self.special["sep"]] + ([*seg_b, self.special["sep"]] if len(seg_b) else [])
        ids[:len(body)] = body
        types = np.zeros(self.seq_len, dtype=np.int64)
        types[len(seg_a) + 2:len(body)] = 1
        none = np.full(self.seq_len, -100, dtype=np.int64)
        return self._fields(task, ids, types, len(body), none, none.copy(), corpus.label(j))

    def _reordering(self, g, doc: int, lo: int, hi: int):
        """The run cut at sentence boundaries into k <= 3 pieces, shuffled; the label is the permutation."""
        _, first, end = self.sentences
        k = int(g.integers(1, min(3, hi - lo) + 1))
        cuts = np.sort(g.choice(np.arange(lo + 1, hi), size=k - 1, replace=False)) if k > 1 else np.zeros(0, int)
        bounds = [lo, *cuts.tolist(), hi]
        perm = tuple(int(i) for i in g.permutation(k))
        budget = self.seq_len - 1 - k  # [CLS] and one [SEP] after each piece
        pieces = []
        for i in perm:
            t0, t1 = int(first[bounds[i]]), int(end[bounds[i + 1] - 1])
            t1 = min(t1, t0 + max(budget, 0))
            budget -= t1 - t0
            pieces.append(((doc, t0, t1), 0))
        return pieces, PERMUTATIONS.index(perm)

    def _distance(self, g, doc: int, pos: int, lo: int, hi: int):
        """A sentence and the next one (0), a non-adjacent one of its document (1) or one of another (2)."""
        doc_pos, first, end = self.sentences
        s0, s1 = (int(x) for x in np.searchsorted(doc_pos, [pos, pos + 1]))
        j = int(g.integers(lo, hi))
        far = [i for i in range(s0, s1) if abs(i - j) > 1]
        choices = [c for c, ok in ((0, j + 1 < s1), (1, bool(far)), (2, len(self.docs) > 1)) if ok]
        label = int(g.choice(choices))
        if label == 2:
            other = int(g.integers(len(self.docs) - 1))
            other += other >= pos
            o0, o1 = (int(x) for x in np.searchsorted(doc_pos, [other, other + 1]))
            k, b_doc = int(g.integers(o0, o1)), int(self.docs[other])
        else:
            k, b_doc = (j + 1 if label == 0 else int(g.choice(far))), doc
        a, b = _truncate_pair(g, (doc, int(first[j]), int(end[j])), (b_doc, int(first[k]), int(end[k])),
                              self.max_tokens)
        return [(a, 0), (b, 1)], label
