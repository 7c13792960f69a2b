"""ERNIE 2.0's task heads beyond masked LM: per-token classifiers and [CLS] classifiers (ptm-only: the
Hugging Face ErnieForPreTraining export keeps the MLM and NSP heads). The tasks: pretrain/objectives/ernie.py."""
from __future__ import annotations

from torch import nn

from pretrain.objectives.ernie import SEQUENCE_TASKS, TASK_SPECS, TOKEN_TASKS


class ErnieTaskHeads(nn.Module):
    """`labelled`: {task: number of classes} of the semantic-aware tasks trained from labelled data."""

    def __init__(self, hidden_size: int, init_std: float, labelled: dict[str, int] | None = None):
        super().__init__()
        self.token = nn.ModuleDict({t: nn.Linear(hidden_size, TASK_SPECS[t].classes) for t in TOKEN_TASKS})
        classes = {**{t: TASK_SPECS[t].classes for t in SEQUENCE_TASKS if TASK_SPECS[t].classes}, **(labelled or {})}
        self.sequence = nn.ModuleDict({t: nn.Linear(hidden_size, n) for t, n in classes.items()})
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=init_std)
                nn.init.zeros_(m.bias)
