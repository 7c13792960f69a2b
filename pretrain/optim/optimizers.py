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

    layout = None  # a `pretrain.parallel.layout.Layout` naming the runs of the tensors (ZeRO partitions, TP
    # shards), where these are not the model's parameters: the engine sets it

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                 foreach: bool | None = None, **extra):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, **extra))
        self._foreach = foreach
        self.idle: frozenset[str] = frozenset()  # parameters (layout names) this step trains not: left as they are
        self.idle_steps: dict[str, int] = {}  # applied steps each parameter sat idle (`rested`): its own step count
        # is its tensor's less these, as torch counts a parameter's steps that had a gradient
        self._split: dict = {}  # (tensor, idle, lags) -> its runs (`_runs`)

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

    def rested(self) -> None:
        """Count an applied step (one that reached the weights; not an fp16 overflow) for the idle parameters."""
        for name in self.idle:
            self.idle_steps[name] = self.idle_steps.get(name, 0) + 1

    def _batches(self, params: list[torch.Tensor], together: bool):
        """`Batch`es of tensors at the same step count, after advancing each tensor's state one step (moments
        created on the first step). A parameter that skipped steps (no gradient) lands in a batch of its own; unless
        `together`, every parameter does. Under a layout, a tensor holding idle parameters, or parameters whose step
        counts differ (`idle_steps`), is stepped in runs: views, each at its parameters' count, idle runs left out."""
        batches: dict = {}
        for p in params:
            state = self.state[p]
            if not state:
                state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
            state["step"] += 1
            tensors = (p, p.grad, state["exp_avg"], state["exp_avg_sq"])
            for step, at, length in self._runs(p, state["step"]):
                piece = tensors if at is None else [t.view(-1)[at:at + length] for t in tensors]
                batch = batches.setdefault((step, at is None) if together else len(batches), Batch(step))
                batch.add(piece, None if at is None else (p, at))
        yield from batches.values()

    def _runs(self, p: torch.Tensor, step: int) -> list[tuple[int, int | None, int]]:
        """(step count, first element or None for the whole tensor, length) of the parts of `p` to step."""
        if self.layout is None or not (self.idle or self.idle_steps):
            return [(step, None, p.numel())]
        lags = tuple(sorted((n, k) for n, k in self.idle_steps.items() if n not in self.idle))
        key = (id(p), self.idle, lags)  # (the runs change where a phase begins: cached, not found every step)
        if key not in self._split:
            self._split[key] = self._split_runs(p, dict(lags))
        return [(step - lag, at, length) for lag, at, length in self._split[key]]

    def _split_runs(self, p: torch.Tensor, lags: dict[str, int]) -> list[tuple[int, int | None, int]]:
        """(steps behind the tensor's, first element or None for the whole tensor, length) of the parts of `p`
        that are not idle, neighbours at the same count joined."""
        runs, at = [], 0
        for name, length in self.layout.runs(p):
            lag = None if name in self.idle else lags.get(name, 0)
            if runs and runs[-1][0] == lag and runs[-1][1] + runs[-1][2] == at:
                runs[-1] = (lag, runs[-1][1], runs[-1][2] + length)
            elif lag is not None:
                runs.append((lag, at, length))
            at += length
        return [(0, None, p.numel())] if runs == [(0, 0, p.numel())] else runs

    def _step_group(self, group: dict, params: list[torch.Tensor]) -> None:
        raise NotImplementedError


class Batch:
    """Tensors (or runs of tensors) a multi-tensor call steps together, all at `step`: `tensors` (params, grads,
    exp_avgs, exp_avg_sqs), and `where` each came from ((tensor, first element) for a run, None for a whole)."""

    def __init__(self, step: int):
        self.step, self.tensors, self.where = step, ([], [], [], []), []

    def add(self, piece, where) -> None:
        for out, t in zip(self.tensors, piece):
            out.append(t)
        self.where.append(where)


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
        for b in self._batches(params, self.foreach or self.fused):
            F.adamw_update(*b.tensors, step=b.step, lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                           weight_decay=group["weight_decay"], fused=self.fused)


class Lamb(_Adam):
    """LAMB (You et al. 2019, Algorithm 2). Group options: lr, betas, eps, weight_decay, adapt (trust ratio on).
    Under a `layout`, each whole parameter's trust ratio is computed across processes."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01,
                 adapt: bool = True, foreach: bool | None = None):
        super().__init__(params, lr, betas, eps, weight_decay, foreach, adapt=adapt)

    def _step_group(self, group, params):
        beta1, beta2 = group["betas"]
        ordered, updates, stepped_in_runs = [], [], {}
        for b in self._batches(params, self.foreach):
            out = None  # runs (a batch holds runs or whole tensors): into their tensor's update, zero on idle runs
            if b.where[0] is not None:
                out = []
                for p, (whole, at) in zip(b.tensors[0], b.where):
                    if id(whole) not in stepped_in_runs:
                        stepped_in_runs[id(whole)] = whole, torch.zeros_like(whole)
                    out.append(stepped_in_runs[id(whole)][1].view(-1)[at:at + p.numel()])
            made = F.lamb_update(*b.tensors, step=b.step, beta1=beta1, beta2=beta2, eps=group["eps"],
                                 weight_decay=group["weight_decay"], out=out)
            if out is None:
                ordered += b.tensors[0]
                updates += made
        for whole, update in stepped_in_runs.values():  # (trust ratios are taken over whole tensors)
            ordered.append(whole)
            updates.append(update)
        ratios = self.trust_ratios(ordered, updates) if group["adapt"] else None  # (every rank: an all-reduce)
        if not ordered:  # every run idle (a ZeRO partition holding only heads the phase trains not)
            return
        if ratios:
            F.scale(*ratios, foreach=self.foreach)
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
