"""Memory of one GPU by component, from the config alone (no torch, no megatron import): parameter counts held to
the model built on the meta device, model states following DeepSpeed's ZeRO partitioning, activations following
Korthikanti et al. 2022 (pretrain/cost.py; docs/performance.md lists the assumptions). `ptm plan` prints it, and
`train.micro_batch_size: auto` takes the largest micro batch it fits.

    plan = estimate(cfg, world_size=8, gpu_memory_gib=80)     # bytes per GPU, plan.fits, plan.max_micro_batch
    auto_micro_batch(cfg, world_size=8, capacity_gib=80)       # a divisor of global batch / data-parallel size
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from pretrain.config import AUTO, Config, ConfigError
from pretrain.cost import (STATE_BYTES, activation_bytes, count_parameters, largest_module, model_state_bytes,
                           objective_parameters, stream_memory_bytes, teacher_parameters)

GIB = 1 << 30
CUDA_CONTEXT = GIB  # assumed: CUDA context, cuBLAS/NCCL workspaces, allocator slack
REDUCE_BUCKET = 500_000_000  # DeepSpeed's reduce_bucket_size (elements): one gradient bucket, allocated whole

COMPONENTS = {"weights": "weights", "gradients": "gradients", "optimizer_states": "optimizer states",
              "zero3_gathered": "ZeRO-3 gathered module", "activations": "activations", "logits": "logits",
              "stream_memory": "memory of the streams", "teacher": "frozen teacher",
              "buffers": "CUDA context + reduce bucket"}  # Plan's GPU fields and their row labels


@dataclass
class Plan:
    """Memory of one GPU in bytes, by component, for one config on `tp` x `dp` GPUs."""
    params: int  # the whole model
    params_per_rank: int  # one TP rank
    tp: int
    dp: int
    weights: int
    gradients: int
    optimizer_states: int  # fp32 master copy (mixed precision) and moments, unless offloaded
    zero3_gathered: int  # ZeRO-3: the largest module's full weights and gradients
    activations: int  # transformer layers, kept for the backward pass
    logits: int  # fp32 LM-head logits
    stream_memory: int  # a recurrent model's memory of its streams, kept between steps (model.mem_len)
    teacher: int  # a distillation's frozen teacher: its weights (split by TP, and by DP under ZeRO-3)
    buffers: int  # CUDA context and the gradient reduce bucket
    cpu_offload: int  # CPU memory per GPU process (ZeRO-Offload)
    teacher_params: int | None = 0  # per TP rank; None: named but not readable here (not counted)
    gpu_memory: int | None = None  # capacity checked against
    max_micro_batch: int | None = None  # the largest micro batch that fits gpu_memory

    @property
    def total(self) -> int:
        return sum(getattr(self, name) for name in COMPONENTS)

    @property
    def fits(self) -> bool | None:
        return None if self.gpu_memory is None else self.total <= self.gpu_memory


def estimate(cfg: Config, world_size: int, gpu_memory_gib: float | None = None) -> Plan:
    """Memory per GPU of training `cfg` on `world_size` GPUs, and the largest micro batch that fits
    `gpu_memory_gib` (when given; train.micro_batch_size=auto is picked for it). Raises ConfigError for a config that
    would not start."""
    cfg = with_micro_batch(cfg, world_size, gpu_memory_gib)
    m, z, tp = cfg.model, cfg.zero, cfg.parallel.tp
    dp = data_parallel_size(cfg, world_size)
    n = count_parameters(m, tp) + objective_parameters(cfg)
    weights, gradients, optimizer, cpu = model_state_bytes(n, dp, z.stage, z.offload, cfg.precision)
    weight, grad, _ = STATE_BYTES[cfg.precision]
    gathered = (weight + grad) * largest_module(m, tp) if z.stage == 3 else 0
    activations, logits = activation_bytes(cfg, cfg.train.micro_batch_size)
    teacher = teacher_parameters(cfg)
    plan = Plan(params=count_parameters(m) + objective_parameters(cfg), params_per_rank=n, tp=tp, dp=dp, weights=weights, gradients=gradients,
                optimizer_states=optimizer, zero3_gathered=gathered, activations=activations, logits=logits,
                stream_memory=stream_memory_bytes(cfg, dp), teacher=weight * (teacher or 0) // (dp if z.stage == 3 else 1),
                buffers=CUDA_CONTEXT + REDUCE_BUCKET * grad, cpu_offload=cpu, teacher_params=teacher)
    if gpu_memory_gib is not None:
        plan.gpu_memory = int(gpu_memory_gib * GIB)
        one = sum(activation_bytes(cfg, 1))  # activations grow linearly with the micro batch, from a constant part
        per_sample = sum(activation_bytes(cfg, 2)) - one  # (the fused LM loss's weight-gradient sum)
        fixed = one - per_sample
        plan.max_micro_batch = max(0, (plan.gpu_memory - plan.total + activations + logits - fixed) // per_sample)
    return plan


def data_parallel_size(cfg: Config, world_size: int) -> int:
    """world_size / tp, after the config's own checks (less those about the dataset and the global batch)."""
    tp = cfg.parallel.tp
    if world_size < 1 or world_size % tp:
        raise ConfigError(f"{world_size} GPUs do not split into parallel.tp={tp} groups; "
                          f"use a multiple of {tp} GPUs or another parallel.tp")
    if cfg.model.vocab_size < 1:
        raise ConfigError("model.vocab_size is 0 (the dataset's); give --vocab-size or set model.vocab_size")
    probe = copy.deepcopy(cfg)
    probe.data.path = probe.data.path or "unused"
    probe.train.global_batch_size = probe.train.micro_batch_size * (world_size // tp)
    probe.train.batch_rampup = []  # (a ramp's batches are checked against the run's global batch)
    probe.validate(world_size // tp, paths=False)  # (a plan writes nothing: out_dir is the run's business)
    dp = world_size // tp
    if cfg.train.batch_rampup and cfg.train.batch_unit() % dp:
        raise ConfigError(f"train.batch_rampup={cfg.train.batch_rampup}: its batches are not whole numbers of samples "
                          f"per data-parallel rank (data-parallel size {dp}); make START and INCREMENT multiples of "
                          f"{dp}")
    return dp


HEADROOM = 0.85  # the share of a GPU's memory that `auto` fills: the allocator's fragmentation, kernels' workspaces


def auto_micro_batch(cfg: Config, world_size: int, capacity_gib: float | None) -> int:
    """`train.micro_batch_size: auto`: the largest divisor of the per-rank batch (global batch / data-parallel size)
    whose estimate fits HEADROOM of `capacity_gib` (None: the whole per-rank batch, no accumulation). Gradient
    accumulation keeps the global batch, and training results do not depend on the split."""
    probe = copy.deepcopy(cfg)
    probe.train.micro_batch_size = 1
    dp = data_parallel_size(probe, world_size)
    per_rank, global_batch = cfg.train.global_batch_size // dp, cfg.train.global_batch_size
    if global_batch % dp:
        raise ConfigError(f"train.global_batch_size={global_batch} is not divisible by the data-parallel size {dp}; "
                          f"set train.global_batch_size to a multiple of {dp}")
    if capacity_gib is None:
        return per_rank
    largest = estimate(probe, world_size, HEADROOM * capacity_gib).max_micro_batch
    fitting = [b for b in range(min(largest, per_rank), 0, -1) if per_rank % b == 0]
    if not fitting:
        raise ConfigError(f"train.micro_batch_size=auto: not even micro batch 1 fits {HEADROOM:.0%} of "
                          f"{capacity_gib:.1f} GiB per rank; raise zero.stage or parallel.tp, or set "
                          f"model.activation_checkpointing=true (`ptm plan` shows the memory by component)")
    return fitting[0]


def with_micro_batch(cfg: Config, world_size: int, capacity_gib: float | None) -> Config:
    """`cfg` itself, or with train.micro_batch_size=auto a copy with the micro batch `auto_micro_batch` picks."""
    if cfg.train.micro_batch_size != AUTO:
        return cfg
    cfg = copy.deepcopy(cfg)
    cfg.train.micro_batch_size = auto_micro_batch(cfg, world_size, capacity_gib)
    return cfg
