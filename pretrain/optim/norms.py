"""Norms as sums of squares, so that sharded tensors (tensor-parallel slices, ZeRO partitions) can add up their
partial sums across processes before the square root (gradient clipping is DeepSpeed's, which does the same)."""
from __future__ import annotations

import torch


def sum_of_squares(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Each tensor's sum of squares, accumulated in at least fp32: a 1-D tensor, one entry per tensor."""
    return torch.stack([_wide(t.detach()).square().sum() for t in tensors])


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.element_size() < 4 else t
