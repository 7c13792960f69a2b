"""Norms as sums of squares, so that sharded tensors (tensor-parallel slices, ZeRO partitions) can add up their
partial sums across processes before the square root."""
from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


def sum_of_squares(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Each tensor's sum of squares, accumulated in at least fp32: a 1-D tensor, one entry per tensor."""
    return torch.stack([_wide(t.detach()).square().sum() for t in tensors])


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.element_size() < 4 else t


def grad_sum_of_squares(params: list[torch.Tensor]) -> torch.Tensor:
    """The sum of squares of the gradients of `params` on this process (0-d): the default hook of grad_norm.
    A sharded trainer passes one that all-reduces the partial sums (counting replicated parameters once)."""
    grads = [p.grad for p in params if p.grad is not None]
    return sum_of_squares(grads).sum() if grads else torch.zeros(())


SumOfSquares = Callable[[list[torch.Tensor]], torch.Tensor]


def grad_norm(params: Iterable[torch.Tensor], sum_squares: SumOfSquares = grad_sum_of_squares) -> torch.Tensor:
    """The global L2 norm of the gradients (0-d fp32)."""
    return sum_squares([p for p in params if p.grad is not None]).sqrt()


def clip_grad_norm_(params: Iterable[torch.Tensor], max_norm: float,
                    sum_squares: SumOfSquares = grad_sum_of_squares) -> torch.Tensor:
    """Scale the gradients in place so that their global L2 norm is at most `max_norm`, as
    torch.nn.utils.clip_grad_norm_ does; returns the norm before clipping."""
    params = [p for p in params if p.grad is not None]
    norm = grad_norm(params, sum_squares)
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for p in params:
        p.grad.mul_(coef.to(p.grad.device, p.grad.dtype))
    return norm
