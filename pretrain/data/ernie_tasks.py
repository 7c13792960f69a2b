"""ERNIE 2.0's pretraining tasks (Sun et al. 2020): what each predicts, from which samples (pretrain/data/multitask.py
builds them; pretrain/objectives/ernie.py trains them). Plain data: imported by the config without numpy."""
from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    group: int  # the task-type embedding id: 0 word-aware, 1 structure-aware, 2 semantic-aware
    kind: str  # mlm (masked tokens) | token (a class per word) | sequence (a class per sample, on [CLS])
    classes: int  # 0: from the labelled dataset (ernie.task_data)
    help: str


PERMUTATIONS = [p for k in (1, 2, 3) for p in itertools.permutations(range(k))]  # sentence_reordering classes
TASK_SPECS = {
    "knowledge_masking": Task(0, "mlm", 0, "masked LM with phrase and entity masking (word-aware)"),
    "capitalization": Task(0, "token", 2, "predict whether a word is capitalised (word-aware)"),
    "token_document_relation": Task(0, "token", 2, "predict whether a token also occurs in other segments of its "
                                                   "document (word-aware)"),
    "sentence_reordering": Task(1, "sequence", len(PERMUTATIONS), "restore the order of shuffled segments "
                                                                  "(structure-aware)"),
    "sentence_distance": Task(1, "sequence", 3, "adjacent sentences, same document or another document "
                                                "(structure-aware)"),
    "discourse_relation": Task(2, "sequence", 0, "relation between two sentences, from labelled data "
                                                 "(semantic-aware)"),
    "ir_relevance": Task(2, "sequence", 0, "query-title relevance, from labelled data (semantic-aware)"),
}
TASKS = tuple(TASK_SPECS)  # a sample's `task` field is the index here
TOKEN_TASKS = tuple(t for t, s in TASK_SPECS.items() if s.kind == "token")
SEQUENCE_TASKS = tuple(t for t, s in TASK_SPECS.items() if s.kind == "sequence")
USER_LABELED = tuple(t for t in SEQUENCE_TASKS if not TASK_SPECS[t].classes)  # these need ernie.task_data
