"""Where each model parameter's values live in this rank's optimizer tensors under DeepSpeed.

DeepSpeed hands the client optimizer fp32 tensors that are not the model's parameters:

* ZeRO 0, fp32: the parameters themselves; fp16/bf16: one fp32 master copy per parameter;
* ZeRO 1/2: per param group, this rank's equal slice of the group's parameters flattened end to end
  (bf16 with fp32 gradient accumulation at ZeRO-1: DeepSpeed's BF16_Optimizer, flattened in group order);
* ZeRO 3: per sub-group, this rank's slice of every parameter (each parameter is split on its own),
  concatenated.

A `Layout` maps those tensors back to named parameters as `Segment`s. With it, LAMB adds up each
parameter's sums of squares over the pieces (all-reduced over the data-parallel group when ZeRO partitions,
over the tensor-parallel group for parameters megatron-core splits) before taking per-parameter trust
ratios, and checkpoints are written as named pieces that any other layout can read back.

This is the one module that reads DeepSpeed's private optimizer state (also the loss scaler's, and the
construction step of its unfused mixed-precision wrapper): a DeepSpeed upgrade touches only this file.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from deepspeed.runtime.base_optimizer import ZeROOptimizer
from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

from pretrain import device as dev
from pretrain.optim.norms import sum_of_squares
from pretrain.optim.optimizers import trust_ratios
from pretrain.parallel import mcore


@dataclass(frozen=True)
class Segment:
    name: str  # the model parameter (this TP rank's shard of it)
    start: int  # first element, in the flattened parameter
    offset: int  # first element, in the optimizer tensor
    length: int


class Layout:
    """This rank's optimizer tensors as segments of named parameters.

    `partitioned`: the tensors hold disjoint pieces across the data-parallel ranks (ZeRO >= 1), so
    per-parameter sums are all-reduced over DP; otherwise every DP rank holds everything and only
    DP rank 0 writes checkpoints (`owner`)."""

    def __init__(self, model: torch.nn.Module, tensors: list[tuple[torch.Tensor, list[Segment]]], partitioned: bool):
        named = list(model.named_parameters())
        self.names = [n for n, _ in named]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.shapes = {n: tuple(getattr(p, "ds_shape", p.shape)) for n, p in named}
        self.split = torch.tensor([bool(getattr(p, "tensor_model_parallel", False)) for _, p in named])
        self.tensors = tensors
        self.partitioned = partitioned
        self.owner = partitioned or mcore.dp_rank() == 0
        self._segments = {id(t): segs for t, segs in tensors}
        self._runs: dict[int, tuple[list[int | None], list[int]]] = {}
        self._owners: dict[tuple[int, ...], torch.Tensor] = {}  # on the device once: a copy of host data waits for it

    # ---- building from a DeepSpeed engine ------------------------------------------------------------

    @classmethod
    def of(cls, engine) -> Layout:
        """The layout of a DeepSpeed engine's optimizer (ZeRO 0-3, any precision)."""
        model, opt = engine.module, engine.optimizer
        name = {id(p): n for n, p in model.named_parameters()}
        stage = engine.zero_optimization_stage()
        if isinstance(opt, BF16_Optimizer):
            return cls(model, _bf16(opt, name), partitioned=True)
        if stage == 3:
            return cls(model, _stage3(opt, name), partitioned=True)
        if stage in (1, 2):
            return cls(model, _stage1_2(opt, name), partitioned=True)
        pairs = zip(_flat(opt.fp32_groups), _flat(opt.fp16_groups)) if hasattr(opt, "fp32_groups") else \
            ((p, p) for g in opt.param_groups for p in g["params"])
        return cls(model, [(master, [Segment(name[id(p)], 0, 0, p.numel())]) for master, p in pairs],
                   partitioned=False)

    # ---- sharded norms ---------------------------------------------------------------------------------

    def segments(self, tensor: torch.Tensor) -> list[Segment]:
        return self._segments[id(tensor)]

    def sums_of_squares(self, tensors: list[torch.Tensor], values: list[torch.Tensor],
                        wide: torch.dtype = torch.float32) -> torch.Tensor:
        """Each named parameter's whole sum of squares (in `wide`, indexed like `names`) of `values`, which are laid
        out like the optimizer tensors `tensors` (the tensors themselves, their updates, ...): one multi-tensor
        norm over every segment of every tensor, added up per parameter."""
        pieces, owners = [], []
        for t, v in zip(tensors, values):
            flat = v.reshape(-1)
            for s in self.segments(t):
                pieces.append(flat[s.offset:s.offset + s.length])
                owners.append(self.index[s.name])
        sums = torch.zeros(len(self.names), dtype=wide, device=values[0].device if values else None)
        if pieces:
            key = tuple(map(id, tensors))
            if key not in self._owners:
                self._owners[key] = torch.tensor(owners, device=sums.device)
            sums.index_add_(0, self._owners[key], sum_of_squares(pieces, wide))
        if self.partitioned:
            dev.all_reduce(sums, mcore.dp_group())
        if mcore.tp_size() > 1:
            split = self.split = self.split.to(sums.device)
            parts = dev.all_reduce(sums * split, mcore.tp_group())
            sums = torch.where(split, parts, sums)
        return sums

    def grad_norm(self) -> torch.Tensor:
        """The global norm of the gradients of optimizer tensors that are the parameters themselves (fp32 at ZeRO-0,
        where DeepSpeed's step measures none: `measures_grad_norm`), taken after the last backward (which reduced them
        over DP) and before the step (which clips them): each split parameter's shards and each replicated one once,
        in fp64 as DeepSpeed's ZeRO norms (torch's fp32 norm on CPU is 3e-4 off on a word-embedding gradient)."""
        tensors = [t for t, _ in self.tensors if t.grad is not None]
        return self.sums_of_squares(tensors, [t.grad for t in tensors], torch.float64).sum().sqrt()

    def trust_ratios(self, params: list[torch.Tensor], updates: list[torch.Tensor]
                     ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """LAMB's ||w|| / ||u|| of each whole parameter, as (pieces of `updates`, 0-d ratios) to multiply together:
        a whole update where its optimizer tensor is one parameter, else each run of its elements that belongs to
        one parameter (elements of no parameter are left alone). Views and host-side lengths: no element-wise
        index (over a flat ZeRO partition that was a gather as large as the model, 10 ms a step for BERT-large on
        an H200)."""
        ratio = trust_ratios(self.sums_of_squares(params, params), self.sums_of_squares(params, updates))
        pieces, ratios = [], []
        for t, update in zip(params, updates):
            owners, lengths = self._pieces(t)
            runs = [update] if len(owners) == 1 else update.view(-1).split(lengths)
            for owner, run in zip(owners, runs):
                if owner is not None:
                    pieces.append(run)
                    ratios.append(ratio[owner])
        return pieces, ratios

    def runs(self, t: torch.Tensor) -> list[tuple[str | None, int]]:
        """(parameter name, None for a gap; length) of each run of optimizer tensor `t`'s elements, in order."""
        return [(None if owner is None else self.names[owner], length) for owner, length in zip(*self._pieces(t))]

    def _pieces(self, t: torch.Tensor) -> tuple[list[int | None], list[int]]:
        """The parameter index (None for gaps) and length of each run of `t`'s elements."""
        key = id(t)
        if key not in self._runs:
            owners, lengths, end = [], [], 0
            for s in sorted(self.segments(t), key=lambda s: s.offset):
                if s.offset > end:
                    owners.append(None)
                    lengths.append(s.offset - end)
                owners.append(self.index[s.name])
                lengths.append(s.length)
                end = s.offset + s.length
            if end < t.numel():
                owners.append(None)
                lengths.append(t.numel() - end)
            self._runs[key] = (owners, lengths)
        return self._runs[key]


def undo_construction_step(engine) -> None:
    """DeepSpeed's unfused fp16/bf16 wrapper (ZeRO-0) calls the optimizer's step() once with zero gradients while
    it is built, so AdamW/LAMB would start at step 1 with one weight-decay step applied to the fp32 masters.
    Undo it: no optimizer state, masters equal to the weights again (they were copied from them)."""
    opt = engine.optimizer
    if engine.zero_optimization_stage() or not hasattr(opt, "fp32_groups"):
        return
    opt.optimizer.state.clear()
    with torch.no_grad():
        for master, p in zip(_flat(opt.fp32_groups), _flat(opt.fp16_groups)):
            master.copy_(p.float())


def measures_grad_norm(engine) -> bool:
    """Whether DeepSpeed's step measures the gradient norm (`engine.get_global_grad_norm()`): its ZeRO optimizers
    and mixed-precision wrappers do (BF16_Optimizer's attribute appears at its first step); the client optimizer it
    steps bare (fp32 at ZeRO-0) leaves it None."""
    return engine.optimizer is not engine.client_optimizer


def _scaler(opt):
    """The object that holds the dynamic loss scale: ZeRO's `loss_scaler`, the fp16/bf16 wrappers'
    `loss_scale_config`; None without loss scaling."""
    return getattr(opt, "loss_scaler", None) or getattr(opt, "loss_scale_config", None)


def loss_scale(opt) -> float:
    """The current loss scale (1 without loss scaling)."""
    scaler = _scaler(opt)
    return float(scaler.cur_scale) if scaler is not None else 1.0


def unapplied_loss_scale(engine) -> float:
    """The fp16 loss scale that `engine.backward` leaves to ptm: DeepSpeed 0.19.8 scales the loss only for its ZeRO
    optimizers, while the ZeRO-0 fp16 wrappers (FP16_Optimizer, FP16_UnfusedOptimizer) still divide the gradients
    (and their norm) by the scale in step (deepspeed #8393): updates cur_scale times too small. 1 elsewhere."""
    if not engine.fp16_enabled() or isinstance(engine.optimizer, ZeROOptimizer):
        return 1.0
    return loss_scale(engine.optimizer)


def loss_scale_state(opt) -> dict:
    """The loss scaler's counters and settings (scale, iteration, last overflow, hysteresis), for checkpoints."""
    scaler = _scaler(opt)
    return {k: v for k, v in vars(scaler).items() if isinstance(v, (bool, int, float)) or v is None} if scaler else {}


def restore_loss_scale(opt, state: dict) -> None:
    scaler = _scaler(opt)
    for k, v in state.items() if scaler is not None else ():
        if hasattr(scaler, k):
            setattr(scaler, k, v)


def engine_counters(engine) -> dict:
    """DeepSpeed's step and sample counters, for checkpoints."""
    return {k: getattr(engine, k) for k in ("global_steps", "global_samples", "skipped_steps")}


def restore_engine_counters(engine, counters: dict) -> None:
    """Counters from a checkpoint of any layout; micro_steps (which decides the accumulation boundaries) counts
    this layout's micro-batches per step."""
    for k, v in counters.items():
        if k != "micro_steps":  # checkpoints before this version saved it too
            setattr(engine, k, v)
    engine.micro_steps = engine.global_steps * engine.gradient_accumulation_steps()


def _flat(groups):
    return [p for g in groups for p in g]


def _stage1_2(opt, name) -> list[tuple[torch.Tensor, list[Segment]]]:
    """ZeRO 1/2: group i is flattened in `round_robin_bit16_groups[i]` order at `round_robin_bit16_offsets[i]`;
    this rank owns elements [rank * partition_size, (rank + 1) * partition_size)."""
    out = []
    for i, master in enumerate(opt.single_partition_of_fp32_groups):
        rank = dist.get_rank(group=opt.real_dp_process_group[i])
        size = int(opt.partition_size[i])
        lo, hi = rank * size, (rank + 1) * size
        segments = []
        for p, at in zip(opt.round_robin_bit16_groups[i], opt.round_robin_bit16_offsets[i]):
            begin, end = max(lo, at), min(hi, at + p.numel())
            if begin < end:
                segments.append(Segment(name[id(p)], begin - at, begin - lo, end - begin))
        out.append((master, segments))
    return out


def _bf16(opt, name) -> list[tuple[torch.Tensor, list[Segment]]]:
    """BF16_Optimizer: group i is flattened in `bf16_groups[i]` order; this rank owns the equal slice
    `fp32_groups_flat_partition[i]` at rank * its size."""
    out = []
    for i, master in enumerate(opt.fp32_groups_flat_partition):
        rank = dist.get_rank(group=opt.real_dp_process_group[i])
        lo, hi, at, segments = rank * master.numel(), (rank + 1) * master.numel(), 0, []
        for p in opt.bf16_groups[i]:
            begin, end = max(lo, at), min(hi, at + p.numel())
            if begin < end:
                segments.append(Segment(name[id(p)], begin - at, begin - lo, end - begin))
            at += p.numel()
        out.append((master, segments))
    return out


def _stage3(opt, name) -> list[tuple[torch.Tensor, list[Segment]]]:
    """ZeRO 3: each parameter p is split on its own into equal pieces of p.partition_numel() elements; a
    sub-group's master tensor concatenates this rank's piece of each of its parameters."""
    out = []
    for i, master in enumerate(opt.fp32_partitioned_groups_flat):
        rank = dist.get_rank(group=opt.sub_group_process_groups[i])
        segments, offset = [], 0
        for p in opt.fp16_groups[i]:
            piece = p.partition_numel()
            begin, end = rank * piece, min((rank + 1) * piece, p.ds_numel)
            if begin < end:
                segments.append(Segment(name[id(p)], begin, offset, end - begin))
            offset += piece
        out.append((master, segments))
    return out
