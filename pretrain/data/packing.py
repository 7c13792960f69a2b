"""Unpadded BERT/ERNIE batches: the samples of a padded micro-batch packed into as few rows of `seq_len` as
their lengths allow (first-fit decreasing), so compute is spent on tokens rather than on padding.

Each packed row carries, per token, `position_ids` (restarting at 0 for each sample) and `sample_index` (1, 2,
... for the samples of the row, 0 for padding); the model attends within a sample only (a block-diagonal mask),
so every real token sees exactly what it saw in the padded row. Per-sample fields (`next_sentence_label`, ERNIE
2.0's `task` and `seq_label`) keep their order and `cls_index` gives each sample's first token as a flat index
into the [rows, seq_len] grid; ERNIE 2.0 batches also get `token_task`, each token's task. The loss terms are
sums over the same labelled tokens and samples, so they equal the padded batch's.
"""
from __future__ import annotations

import torch

TOKEN_FIELDS = ("input_ids", "token_type_ids", "task_type_ids", "labels", "token_labels")
IGNORED = ("labels", "token_labels")  # -100 on padding


def rows_for(lengths: list[int], seq_len: int) -> list[list[int]]:
    """Sample indices per row, first-fit decreasing (longest first; ties by index, so it is deterministic)."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        row = next((r for r, space in enumerate(free) if space >= lengths[i]), None)
        if row is None:
            rows.append([])
            free.append(seq_len)
            row = len(rows) - 1
        rows[row].append(i)
        free[row] -= lengths[i]
    return rows


def pack(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The packed form of a padded micro-batch of BERT-style or ERNIE samples (fields [b, seq_len] with
    `attention_mask`)."""
    b, seq_len = batch["input_ids"].shape
    lengths = batch["attention_mask"].sum(1).tolist()
    rows = rows_for(lengths, seq_len)
    out = {k: torch.zeros(len(rows), seq_len, dtype=batch[k].dtype) for k in TOKEN_FIELDS if k in batch}
    for k in IGNORED:
        if k in out:
            out[k].fill_(-100)
    if "task" in batch:  # ERNIE 2.0: the task of every token, for the per-token tasks (-1 on padding)
        out["token_task"] = torch.full((len(rows), seq_len), -1, dtype=torch.long)
    out["position_ids"] = torch.zeros(len(rows), seq_len, dtype=torch.long)
    out["sample_index"] = torch.zeros(len(rows), seq_len, dtype=torch.long)
    cls_index = torch.zeros(b, dtype=torch.long)
    for r, members in enumerate(rows):
        at = 0
        for k, i in enumerate(members, start=1):
            n = lengths[i]
            for field in out.keys() & set(TOKEN_FIELDS):
                out[field][r, at:at + n] = batch[field][i, :n]
            out["position_ids"][r, at:at + n] = torch.arange(n)
            out["sample_index"][r, at:at + n] = k
            if "token_task" in out:
                out["token_task"][r, at:at + n] = batch["task"][i]
            cls_index[i] = r * seq_len + at
            at += n
    out["cls_index"] = cls_index
    out.update({k: v for k, v in batch.items() if k not in out and k != "attention_mask"})
    return out


def real_tokens(batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """True (1) at the batch's token slots that hold a sample's token (packed or padded); None: no padding."""
    return batch["sample_index"] > 0 if "sample_index" in batch else batch.get("attention_mask")


def padding_fraction(batch: dict[str, torch.Tensor]) -> float:
    """The fraction of the batch's token slots that hold padding (packed or padded)."""
    real = real_tokens(batch)
    return 0.0 if real is None else 1.0 - float(real.float().mean())
