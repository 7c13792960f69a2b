"""Norms as sums of squares, so that sharded tensors (tensor-parallel slices, ZeRO partitions) can add up their
partial sums across processes before the square root (gradient clipping is DeepSpeed's, which does the same)."""
from __future__ import annotations

import torch


def sum_of_squares(tensors: list[torch.Tensor], wide: torch.dtype | None = None) -> torch.Tensor:
    """Each tensor's sum of squares, accumulated in `wide` (None: at least fp32): a 1-D tensor, one entry per tensor
    (one multi-tensor norm over the whole list)."""
    if not tensors:
        return torch.zeros(0)
    wide = wide or (torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32)
    return torch.stack(torch._foreach_norm([t.detach() for t in tensors], 2, dtype=wide)).square()
