"""AdamW and LAMB, with the multi-tensor math in `functional` (the fused-kernel seam).

LAMB follows You et al. 2019 (arXiv 1904.00962), Algorithm 2: Adam moments with bias correction, the update
u = m_hat / (sqrt(v_hat) + eps) + weight_decay * w, and a trust ratio per parameter, ||w|| / ||u|| (1 when
either norm is 0): w -= lr * ratio * u. A param group with `adapt: False` skips the trust ratio (BERT's recipe
excludes biases and LayerNorm weights from both decay and adaptation; see `param_groups`).
"""
from __future__ import annotations

import torch
from torch import nn

from pretrain.optim import functional as F
from pretrain.optim.norms import sum_of_squares


class _Adam(torch.optim.Optimizer):
    """What AdamW and LAMB share: the hyper-parameters, lazily created moments, the closure, and the batching of
    parameters into multi-tensor calls (`foreach`; None: on for CUDA tensors, where one launch for all
    parameters wins, off on CPU -- ZeRO-Offload's partitions too --, where one parameter at a time stays in cache:
    bench/optimizer_step.py)."""

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                 foreach: bool | None = None, **extra):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, **extra))
        self._foreach = foreach

    @property
    def foreach(self) -> bool:
        """Multi-tensor arithmetic: as set, or (None) when every tensor it now steps is on a GPU. Asked at each use,
        not when built: DeepSpeed replaces the parameters by its fp32 partitions, in CPU memory under ZeRO-Offload."""
        return self._foreach if self._foreach is not None else self._all_on("cuda")

    def _all_on(self, *device_types: str) -> bool:
        return all(p.device.type in device_types for g in self.param_groups for p in g["params"])

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._step_group(group, params)
        return loss

    @property
    def implementation(self) -> str:
        return "multi-tensor (torch._foreach_*)" if self.foreach else "one parameter at a time"

    def _batches(self, params: list[torch.Tensor], together: bool):
        """(step, params, grads, exp_avgs, exp_avg_sqs) per batch of tensors at the same step count, after
        advancing each tensor's state one step (moments created on the first step). A parameter that skipped
        steps (no gradient) lands in a batch of its own; unless `together`, every parameter does."""
        batches: dict = {}
        for p in params:
            state = self.state[p]
            if not state:
                state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
            state["step"] += 1
            batches.setdefault(state["step"] if together else id(p), []).append(p)
        for batch in batches.values():
            states = [self.state[p] for p in batch]
            yield (states[0]["step"], batch, [p.grad for p in batch], [s["exp_avg"] for s in states],
                   [s["exp_avg_sq"] for s in states])

    def _step_group(self, group: dict, params: list[torch.Tensor]) -> None:
        raise NotImplementedError


class AdamW(_Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter), numerically torch.optim.AdamW. `fused` (None:
    whenever torch has the kernel for the tensors: floating point on CPU or CUDA) runs torch's fused AdamW
    kernel, one pass per tensor; otherwise the multi-tensor (or per-parameter) arithmetic of `functional`."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01,
                 foreach: bool | None = None, fused: bool | None = None):
        super().__init__(params, lr, betas, eps, weight_decay, foreach)
        self._fused = fused

    @property
    def fused(self) -> bool:
        """torch's fused kernel: as set, or (None) wherever torch has it for the tensors it now steps."""
        return self._fused if self._fused is not None else self._all_on("cpu", "cuda")

    @property
    def implementation(self) -> str:
        return "torch's fused kernel (torch._fused_adamw_)" if self.fused else super().implementation

    def _step_group(self, group, params):
        beta1, beta2 = group["betas"]
        for step, *tensors in self._batches(params, self.foreach or self.fused):
            F.adamw_update(*tensors, step=step, lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                           weight_decay=group["weight_decay"], fused=self.fused)


class Lamb(_Adam):
    """LAMB (You et al. 2019, Algorithm 2). Group options: lr, betas, eps, weight_decay, adapt (trust ratio on).

    `layout`: when the optimizer's tensors are not whole parameters (ZeRO partitions, tensor-parallel
    shards), a `pretrain.parallel.layout.Layout` that computes each whole parameter's trust ratio across
    processes; the engine sets it."""

    layout = None

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01,
                 adapt: bool = True, foreach: bool | None = None):
        super().__init__(params, lr, betas, eps, weight_decay, foreach, adapt=adapt)

    def _step_group(self, group, params):
        beta1, beta2 = group["betas"]
        ordered, updates = [], []
        for step, *tensors in self._batches(params, self.foreach):
            ordered += tensors[0]
            updates += F.lamb_update(*tensors, step=step, beta1=beta1, beta2=beta2, eps=group["eps"],
                                     weight_decay=group["weight_decay"])
        if group["adapt"]:
            F.scale(*self.trust_ratios(ordered, updates), foreach=self.foreach)
        if self.foreach:
            F.lamb_apply(ordered, updates, group["lr"])
            return
        for p, update in zip(ordered, updates):
            F.lamb_apply([p], [update], group["lr"])

    def trust_ratios(self, params: list[torch.Tensor], updates: list[torch.Tensor]
                     ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(pieces of `updates`, one 0-d trust ratio each): whole updates, or the runs of a tensor that packs
        pieces of several parameters (the layout's)."""
        if self.layout is not None:
            return self.layout.trust_ratios(params, updates)
        return updates, list(trust_ratios(*self.sums_of_squares(params, updates)))

    def sums_of_squares(self, params: list[torch.Tensor], updates: list[torch.Tensor]
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-parameter sums of squares of the weights and of their updates (two 1-D fp32 tensors, one entry
        per parameter). A hook for tensors that are each one shard of a parameter: override it to add up the
        shards' partial sums; the ratios follow from these."""
        return sum_of_squares(params), sum_of_squares(updates)


def trust_ratios(w_sq: torch.Tensor, u_sq: torch.Tensor) -> torch.Tensor:
    """||w|| / ||u|| per parameter from sums of squares; 1 where either norm is 0."""
    return torch.where((w_sq > 0) & (u_sq > 0), w_sq.sqrt() / u_sq.sqrt(), torch.ones_like(w_sq))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """BERT's recipe: matrices (linear and embedding weights) get weight decay and LAMB's trust ratio; biases and
    normalisation weights (the parameters with fewer than 2 dimensions) get neither. Empty groups are left out."""
    decay, plain = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else plain).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0, "adapt": False}]
    return [g for g in groups if g["params"]]
