"""ERNIE 2.0's task heads beyond masked LM: per-token classifiers and [CLS] classifiers (ptm-only: the
Hugging Face ErnieForPreTraining export keeps the MLM and NSP heads)."""
from __future__ import annotations

import itertools

from torch import nn

TOKEN_TASKS = ("capitalization", "token_document_relation")
PERMUTATIONS = [p for k in (1, 2, 3) for p in itertools.permutations(range(k))]  # sentence_reordering classes
SEQUENCE_TASKS = {"sentence_reordering": len(PERMUTATIONS), "sentence_distance": 3}


class ErnieTaskHeads(nn.Module):
    """`labelled`: {task: number of classes} of the semantic-aware tasks trained from labelled data."""

    def __init__(self, hidden_size: int, init_std: float, labelled: dict[str, int] | None = None):
        super().__init__()
        self.token = nn.ModuleDict({t: nn.Linear(hidden_size, 2) for t in TOKEN_TASKS})
        classes = {**SEQUENCE_TASKS, **(labelled or {})}
        self.sequence = nn.ModuleDict({t: nn.Linear(hidden_size, n) for t, n in classes.items()})
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=init_std)
                nn.init.zeros_(m.bias)
