"""Per-tensor optimizer math in plain torch: the fused-kernel seam. The optimizers call these functions through
this module (`functional.lamb_update(...)`), so a fused GPU kernel can be bound in their place without touching
the optimizers; every replacement must match them."""
from __future__ import annotations

import math

import torch


def adamw_update(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
                 step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """One AdamW step on one tensor, in place: torch.optim.AdamW's arithmetic, op for op."""
    param.mul_(1 - lr * weight_decay)
    _moments(grad, exp_avg, exp_avg_sq, beta1, beta2)
    param.addcdiv_(exp_avg, _denominator(exp_avg_sq, step, beta2, eps), value=-lr / (1 - beta1 ** step))


def lamb_update(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
                step: int, beta1: float, beta2: float, eps: float, weight_decay: float) -> torch.Tensor:
    """LAMB's update direction for one tensor, u = m_hat / (sqrt(v_hat) + eps) + weight_decay * w; the moments
    are updated in place."""
    _moments(grad, exp_avg, exp_avg_sq, beta1, beta2)
    update = exp_avg / (1 - beta1 ** step) / _denominator(exp_avg_sq, step, beta2, eps)
    return update.add_(param, alpha=weight_decay) if weight_decay else update


def lamb_apply(param: torch.Tensor, update: torch.Tensor, ratio: torch.Tensor | float, lr: float) -> None:
    """w -= lr * trust_ratio * u, in place (`update` is consumed)."""
    param.add_(update.mul_(ratio), alpha=-lr)


def _moments(grad, exp_avg, exp_avg_sq, beta1, beta2) -> None:
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)


def _denominator(exp_avg_sq, step, beta2, eps) -> torch.Tensor:
    """sqrt(v_hat) + eps."""
    return (exp_avg_sq.sqrt() / math.sqrt(1 - beta2 ** step)).add_(eps)
