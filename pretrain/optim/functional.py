"""The optimizers' arithmetic over lists of tensors with torch's multi-tensor (`torch._foreach_*`) operations:
on CUDA these are the multi-tensor-apply kernels that apex's fused optimizers use (a few launches per step
for all parameters instead of a few per parameter); on CPU they run op for op like the per-tensor code.
The optimizers call these functions through this module (`functional.lamb_update(...)`), so another kernel
can be bound in their place; every replacement must match them. Called with one-element lists they are the
per-parameter loop (`foreach=False`, the reference the benchmark compares against)."""
from __future__ import annotations

import math

import torch

Tensors = list[torch.Tensor]


def adamw_update(params: Tensors, grads: Tensors, exp_avgs: Tensors, exp_avg_sqs: Tensors, *, step: int, lr: float,
                 beta1: float, beta2: float, eps: float, weight_decay: float, fused: bool = False) -> None:
    """One AdamW step on tensors that are all at `step`, in place: torch.optim.AdamW's arithmetic, op for op, or
    (`fused`) torch's fused AdamW kernel, one pass over each tensor (the kernel `torch.optim.AdamW(fused=True)`
    runs; CPU and CUDA)."""
    if fused:
        steps = [torch.full((), float(step), device=params[0].device)] * len(params)
        torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=lr, beta1=beta1, beta2=beta2,
                            weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=False)
        return
    if weight_decay:
        torch._foreach_mul_(params, 1 - lr * weight_decay)
    _moments(grads, exp_avgs, exp_avg_sqs, beta1, beta2)
    torch._foreach_addcdiv_(params, exp_avgs, _denominators(exp_avg_sqs, step, beta2, eps),
                            value=-lr / (1 - beta1 ** step))


def lamb_update(params: Tensors, grads: Tensors, exp_avgs: Tensors, exp_avg_sqs: Tensors, *, step: int,
                beta1: float, beta2: float, eps: float, weight_decay: float, out: Tensors | None = None) -> Tensors:
    """LAMB's update directions, u = m_hat / (sqrt(v_hat) + eps) + weight_decay * w, of tensors that are all at
    `step`, new tensors or written into `out`; the moments are updated in place."""
    _moments(grads, exp_avgs, exp_avg_sqs, beta1, beta2)
    if out is None:
        updates = torch._foreach_div(exp_avgs, 1 - beta1 ** step)
    else:
        updates = out
        torch._foreach_copy_(updates, exp_avgs)
        torch._foreach_div_(updates, 1 - beta1 ** step)
    torch._foreach_div_(updates, _denominators(exp_avg_sqs, step, beta2, eps))
    if weight_decay:
        torch._foreach_add_(updates, params, alpha=weight_decay)
    return updates


def scale(tensors: Tensors, factors: Tensors, foreach: bool) -> None:
    """t *= f in place for each pair (LAMB's trust ratios, 0-d tensors, onto its updates)."""
    if foreach:
        torch._foreach_mul_(tensors, factors)
        return
    for t, f in zip(tensors, factors):
        t.mul_(f)


def lamb_apply(params: Tensors, updates: Tensors, lr: float) -> None:
    """w -= lr * u, in place: u already scaled by its trust ratio."""
    torch._foreach_add_(params, updates, alpha=-lr)


def _moments(grads, exp_avgs, exp_avg_sqs, beta1, beta2) -> None:
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)


def _denominators(exp_avg_sqs, step, beta2, eps) -> Tensors:
    """sqrt(v_hat) + eps."""
    out = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(out, math.sqrt(1 - beta2 ** step))
    torch._foreach_add_(out, eps)
    return out
