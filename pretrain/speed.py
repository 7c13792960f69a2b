"""Predicted training speed on a GPU cluster, from the config alone (`ptm plan --gpu NAME --nodes M`).

    hw = gpu("a100-80gb", interconnect="8xhdr")
    p = predict(load("bert-large"), hw, world_size=32)      # p.step, p.samples_per_s, p.mfu, p.parts()

One optimizer step on one GPU is its micro-batches, each

    compute      matmul FLOPs / (peak x matmul x shape)   (model FLOPs + recomputed forwards, / tp; shape: each
                                                       GEMM of M x N x K at M/(M+128) N/(N+128) K/(K+128) of a
                                                       large one's rate, attention's at ATTENTION_RATE; averaged
                                                       over the layer's and the LM head's GEMMs by their FLOPs)
  + memory       elementwise bytes / (HBM bandwidth x Efficiency.memory)   (LayerNorm, bias, GELU, dropout,
                                                                   residual: per kernels=eager or compile)
  + TP           4 all-reduces of the layer's activations per layer (2 forward, 2 backward; +2 recomputed),
                 ring over NVLink, not overlapped
  + ZeRO-2/3     the gradients reduced every micro-batch (ZeRO-2: all-reduced bucket by bucket, DeepSpeed's default;
                 ZeRO-3: reduce-scattered); ZeRO-3 also all-gathers the weights for the forward and again for the
                 backward, except the layers DeepSpeed keeps (used again within stage3_max_reuse_distance: all of a
                 model under 500M parameters); hidden behind the compute where DeepSpeed overlaps them (overlap_comm:
                 ZeRO-3's default, or a deepspeed_config's), else exposed
  + ZeRO-3 waits the ring latency of its per-layer collectives (each layer's gathers and gradient reduce-scatter
                 are collectives of their own): never hidden, the layer's compute waits for its gather to complete

then at the accumulation boundary the gradient all-reduce of ZeRO-0/1 (behind the last backward if overlapped;
BF16_Optimizer never overlaps), the weight all-gather of ZeRO-1/2, and the optimizer (HBM traffic of its passes
over the parameters this rank updates). Gradients travel in DeepSpeed's communication_data_type (`reduce_bytes`),
weights in the model's dtype.

Collectives are rings: 2(n-1)/n of the bytes for an all-reduce, (n-1)/n for a reduce-scatter or all-gather, at
min(NVLink, the node's NICs / tp) per GPU once the group spans nodes, x Efficiency.link, plus a latency per ring step.

The host issues the kernels of a step as the GPU runs them, each launch costing it Hardware.launch_us (Python,
dispatch, the driver: `ptm plan --calibrate` measures it on the node, configs/hardware/gpus.yaml gives a default per
generation): `host` = launches per step (pretrain/launches.py: counted, or estimated from the layers) x launch_us. A
step takes the longer of the device's time and the host's. docs/performance.md derives each term and lists the
published results (and ptm's own GPU runs) it is checked against.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

from pretrain.config import Config, ConfigError
from pretrain.cost import (Launches, checkpointed, count_parameters, decoder_tokens, estimate_launches,
                           flops_per_sample, objective_parameters, predicted_tokens, stack_flops, stacks,
                           tp_launches)
from pretrain.hardware import Efficiency, Hardware, HardwareError, by_device_name, gpu, network
from pretrain.memory import with_micro_batch
from pretrain.stacks import masked_flops
from pretrain.models.config import embedding_width

NVLINK_LATENCY_S = 5e-6  # one ring step inside a node (NCCL's small-message all-reduce over NVLink: ~10 us for 2)
GEMM_HALF = 128  # a GEMM dimension of x runs at x / (x + 128) of a large one's rate (a tile's width: small ones
# waste it)
ATTENTION_RATE = 0.6  # attention's matmuls inside flash / memory-efficient kernels, against a large GEMM's rate
# elements read or written per token by one layer's forward outside the matmuls (16-bit activations, doubled in
# fp32): (replicated per h, per h/tp, per f/tp). eager: LayerNorm x2 (2h each), QKV bias + head layout (6h/tp),
# output bias, dropout (mask: half an element), residual (7.5h) twice, fc1 bias and GELU (4f/tp); compile fuses
# bias + dropout + residual + LayerNorm (4.5h) and bias + GELU (3f/tp). The backward moves twice the forward's.
ELEMENTWISE = {"eager": (19, 12, 4), "compile": (9, 6, 3)}
LOGIT_BYTES = 16  # fp32 logits written, read by softmax, its gradient written and read (unless fused_lm_loss)
RELATIVE_SCORE_BYTES = 60  # NEZHA: fp32 scores per head and key, 15 passes (scores, softmax, dropout, backward)
# HBM bytes per parameter of one optimizer step: ptm's AdamW is torch's fused kernel (read weight, gradient, m,
# v; write weight, m, v: 28); LAMB is 12 multi-tensor passes plus two norms (116); mixed precision adds
# DeepSpeed's fp16/bf16 -> fp32 gradient copy, gradient norm and fp32 -> 16-bit weight copy (16), fp32 the norm.
OPTIMIZER_BYTES = {"adamw": 28, "lamb": 116}
MIXED_PRECISION_BYTES = {"fp32": 4, "bf16": 16, "fp16": 16}
GRAD_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}  # one element in the model's dtype (DeepSpeed's 16-bit weights)
REUSE_DISTANCE = 1e9  # stage3_max_reuse_distance's default: DeepSpeed keeps weights used again within it (parameters)


# ----------------------------------------------------------------------------------------- collectives

def _ring(kind: str, nbytes: float, ranks: int, per_node: int, hw: Hardware, eff: Efficiency,
          tp: int = 1) -> float:
    """Seconds of one all-reduce / reduce-scatter / all-gather of `nbytes` (the whole buffer) over `ranks` GPUs,
    `per_node` of them in each node. Spanning nodes, a group's share of the NICs is 1/tp of the node's (tp
    groups run side by side)."""
    if ranks <= 1:
        return 0.0
    passes = 2 if kind == "all-reduce" else 1
    nodes = math.ceil(ranks / per_node)
    crossing = nodes if nodes > 1 else 0  # ring steps over the network
    bandwidth = hw.nvlink_gbps * 1e9 if nodes == 1 else min(hw.nvlink_gbps * 1e9, hw.network.bandwidth / tp)
    latency = passes * ((ranks - crossing) * NVLINK_LATENCY_S + crossing * hw.network.latency_s)
    return passes * (ranks - 1) / ranks * nbytes / (bandwidth * eff.link) + latency


# ---------------------------------------------------------------------------------------------- model

@dataclass
class Prediction:
    """Seconds of one optimizer step on one GPU, by part, and what follows from them."""
    world_size: int
    tp: int
    dp: int
    accumulation: int
    compute: float  # matmuls, all micro-batches (recomputation included)
    memory: float  # elementwise kernels, all micro-batches
    tp_comm: float
    dp_comm: float  # exposed data-parallel / ZeRO communication
    dp_comm_hidden: float  # overlapped with the compute
    optimizer: float
    zero3_latency: float  # ZeRO-3's per-layer collectives' ring latency, exposed
    flops_per_sample: float  # model FLOPs (no recomputation)
    samples_per_step: int
    seq_len: int
    peak: float
    launches: int = 0  # kernel launches of the step
    launch_s: float = 0.0  # the host's seconds per launch
    launches_counted: bool = False  # counted (pretrain/launches.py), else estimated from the layers
    notes: list = field(default_factory=list)

    @property
    def device(self) -> float:
        """Seconds the GPU works (or waits for its collectives) in a step."""
        return self.compute + self.memory + self.tp_comm + self.dp_comm + self.optimizer + self.zero3_latency

    @property
    def host(self) -> float:
        """Seconds the host takes to launch the step's kernels."""
        return self.launches * self.launch_s

    @property
    def step(self) -> float:
        """The longer of the device's time and the host's: each waits for the other."""
        return max(self.device, self.host)

    @property
    def samples_per_s(self) -> float:
        return self.samples_per_step / self.step

    @property
    def tokens_per_s(self) -> float:
        return self.samples_per_s * self.seq_len

    @property
    def mfu(self) -> float:
        return self.flops_per_sample * self.samples_per_s / (self.world_size * self.peak)

    def parts(self) -> dict[str, float]:
        return {"compute (matmuls)": self.compute, "memory-bound kernels": self.memory,
                "tensor-parallel all-reduces": self.tp_comm,
                "data-parallel / ZeRO communication": self.dp_comm + self.zero3_latency,  # exposed bytes and latency
                "optimizer step": self.optimizer}


def _deepspeed_json(cfg: Config) -> dict:
    """The user's deepspeed_config JSON ({} without one): it sets what ptm leaves at DeepSpeed's defaults."""
    if not (cfg.deepspeed_config and os.path.isfile(cfg.deepspeed_config)):
        return {}
    import json

    with open(cfg.deepspeed_config) as f:
        return json.load(f)


def _bf16_optimizer(cfg: Config) -> bool:
    """Whether DeepSpeed wraps the optimizer in BF16_Optimizer (bf16 weights, fp32 gradient accumulation, ZeRO-1,
    no offload): it all-reduces whole gradients after the backward pass, never overlapped, and gathers the weights."""
    return cfg.precision == "bf16" and cfg.grad_accum_dtype == "fp32" and cfg.zero.stage == 1 and not cfg.zero.offload


def _overlap_comm(cfg: Config) -> bool:
    """DeepSpeed's zero_optimization.overlap_comm for this config: a user's deepspeed_config JSON, else its
    default (on for ZeRO-3 only); BF16_Optimizer and ZeRO-0 never overlap."""
    if cfg.zero.stage == 0 or _bf16_optimizer(cfg):
        return False
    setting = _deepspeed_json(cfg).get("zero_optimization", {}).get("overlap_comm")
    return cfg.zero.stage == 3 if setting is None else bool(setting)


def reduce_bytes(cfg: Config) -> int:
    """Bytes per gradient element DeepSpeed's gradient reduction sends: every stage casts the gradients to the
    engine's communication_data_type first (ZeRO-0 and BF16_Optimizer in engine.allreduce_bucket, ZeRO-1/2 in
    stage_1_and_2's allreduce_bucket, ZeRO-3 in stage3's reduce-scatter): a deepspeed_config's, else fp32 where ptm
    sets it (bf16 with grad_accum_dtype=fp32, pretrain/engine.py), else the model's dtype (DeepSpeed's default)."""
    chosen = (_deepspeed_json(cfg).get("communication_data_type") or "").lower()
    if not chosen and cfg.precision == "bf16" and cfg.grad_accum_dtype == "fp32":
        chosen = "fp32"
    return GRAD_BYTES[chosen or cfg.precision]


def predict(cfg: Config, hw: Hardware, world_size: int, eff: Efficiency = Efficiency(),
            overlap_reduce: bool | None = None, launches: Launches | None = None) -> Prediction:
    """The step of `cfg` on `world_size` GPUs of `hw` (hw.gpus_per_node per node). `overlap_reduce`: whether the
    gradient reduction hides behind the backward pass (and ZeRO-3's gathers behind the compute); default: as
    DeepSpeed does for this config (overlap_comm: on for ZeRO-3, else off unless a deepspeed_config sets it).
    `launches`: the step's kernel launches at TP=1 as pretrain/launches.py counts them (default: estimated);
    train.micro_batch_size=auto is picked as a run on `hw` picks it."""
    cfg = with_micro_batch(cfg, world_size, hw.memory_gib)
    t, b, precision, eff = cfg.parallel.tp, cfg.train.micro_batch_size, cfg.precision, eff.on(hw)
    peak = hw.peak(precision)
    if peak is None:
        raise HardwareError(f"{hw.name} has no {precision} tensor cores; set precision=fp16 (or fp32)")
    if world_size % t:
        raise ConfigError(f"{world_size} GPUs do not split into parallel.tp={t} groups")
    dp, global_batch = world_size // t, cfg.train.global_batch_size
    if global_batch % (b * dp):
        raise ConfigError(f"train.global_batch_size={global_batch} is not a multiple of micro batch {b} x "
                          f"data-parallel size {dp} ({world_size} GPUs / parallel.tp={t}); change one of them, or "
                          f"the GPUs planned (--gpus N)")
    accumulation = global_batch // (b * dp)
    flops = flops_per_sample(cfg)
    compute, memory, tp_comm = _micro_batch(cfg, hw, eff, flops)
    n = count_parameters(cfg.model, t) + objective_parameters(cfg)
    overlap = _overlap_comm(cfg) if overlap_reduce is None else overlap_reduce
    dp_comm, hidden = _data_parallel(cfg, hw, eff, n, dp, accumulation, compute, overlap)
    latency = accumulation * _zero3_latency(cfg, hw, eff, dp)
    notes = [f"parallel.tp={t} spans nodes: its all-reduces cross the network"] if t > hw.gpus_per_node else []
    return Prediction(world_size=world_size, tp=t, dp=dp,
                      accumulation=accumulation, compute=accumulation * compute, memory=accumulation * memory,
                      tp_comm=accumulation * tp_comm, dp_comm=dp_comm, dp_comm_hidden=hidden, zero3_latency=latency,
                      optimizer=_optimizer(cfg, hw, eff, n // dp if cfg.zero.stage >= 1 else n),
                      flops_per_sample=flops, samples_per_step=global_batch, seq_len=cfg.data.seq_len, peak=peak,
                      launches=(launches or estimate_launches(cfg)).of(accumulation) + accumulation * tp_launches(cfg),
                      launch_s=hw.launch_us * 1e-6, launches_counted=launches is not None, notes=notes)


def _micro_batch(cfg: Config, hw: Hardware, eff: Efficiency, flops: float) -> tuple[float, float, float]:
    """(compute, memory-bound, tensor-parallel) seconds of one micro batch on one GPU; `flops`: model FLOPs of
    one sequence."""
    m, t, s, b = cfg.model, cfg.parallel.tp, cfg.data.seq_len, cfg.train.micro_batch_size
    act, kernels, hbm = 4 if cfg.precision == "fp32" else 2, cfg.kernels_on(cuda=True), hw.hbm_gbps * 1e9 * eff.memory
    rate = hw.peak(cfg.precision) * eff.matmul * gemm_shape(cfg)  # achieved matmul FLOP/s
    tp_per_node = min(t, hw.gpus_per_node)
    model_stacks = stacks(m, s, decoder_tokens(cfg), predicted_tokens(cfg))
    executed = flops + sum(masked_flops(st) for st in model_stacks)  # (local layers' masked scores take time too)
    compute, memory, tp_comm = executed * b / t / rate, 0.0, 0.0
    for stack in model_stacks:
        model, q, layers, recomputed = stack.model, stack.seq_len, stack.layers, stack.recomputed
        h, f = model.hidden_size, model.ffn_hidden_size
        layer_flops = b * (stack_flops(stack) + masked_flops(stack)) / layers  # forward + backward of one layer
        compute += recomputed * layer_flops / 3 / t / rate  # the recomputed forwards
        rep, per_h, per_f = ELEMENTWISE[kernels]
        forward = b * q * (rep * h + (per_h * h + per_f * f) / t) * act
        if stack.context:  # cross-attention: a sublayer's norm, residual and dropout, and its attention's traffic
            forward += b * q * (rep * h / 2 + per_h * h / 2 / t) * act
        if model.positional.pair_terms:
            forward += b * q * model.num_heads * q * RELATIVE_SCORE_BYTES / 3 / t
        layer_memory = (3 * layers + recomputed) * forward / hbm
        memory += layer_memory
        reduces = (4 if not stack.context else 6) * layers + 2 * recomputed  # cross-attention's output: 2 more
        tp_comm += reduces * _ring("all-reduce", b * q * h * act, t, tp_per_node, hw, eff)
        if stack.context:  # the gradient of the encoder's output through each layer's keys and values
            tp_comm += layers * _ring("all-reduce", b * stack.context * h * act, t, tp_per_node, hw, eff)
    if not cfg.lm_loss_fusable():  # on CUDA with ptm[kernels] it runs
        memory += b * predicted_tokens(cfg) * m.padded_vocab / t * LOGIT_BYTES / hbm
    # the embeddings' forward all-reduce (vocabulary-parallel lookup) and the LM head input's backward one
    tp_comm += 2 * _ring("all-reduce", b * s * embedding_width(m) * act, t, tp_per_node, hw, eff)
    return compute, memory, tp_comm


def gemm_shape(cfg: Config) -> float:
    """The fraction of a large GEMM's rate that one micro batch's matmuls reach, by their shapes: each GEMM of
    M x N x K (M rows: tokens; N, K: this TP rank's share of the weight) at g(M) g(N) g(K), g(x) = x / (x + 128),
    attention's (q k^T and p v, inside fused kernels) at ATTENTION_RATE, averaged over the blocks' and the LM head's
    GEMMs by their FLOPs (a harmonic mean: the time they take). Small hidden sizes and head counts split over many TP
    ranks run further below the peak than large ones."""
    def g(x: float) -> float:
        return x / (x + GEMM_HALF)

    m, t, s, b = cfg.model, cfg.parallel.tp, cfg.data.seq_len, cfg.train.micro_batch_size
    work = []  # (FLOPs, fraction of the rate)
    for stack in stacks(m, s, decoder_tokens(cfg), predicted_tokens(cfg)):
        model, c, layers = stack.model, stack.context, stack.layers
        h, f, rows = model.hidden_size, model.ffn_hidden_size, b * stack.seq_len
        gemms = [(rows, 3 * h / t, h), (rows, h, h / t), (rows, f / t, h), (rows, h, f / t)]  # QKV, output, fc1, fc2
        gemms += [(rows, f / t, h)] if model.gated_mlp else []  # the gate
        gemms += [(rows, h / t, h), (b * c, 2 * h / t, h), (rows, h, h / t)] if c else []  # cross: q, kv, output
        for m_rows, n, k in gemms:
            work.append((layers * m_rows * n * k, g(m_rows) * g(n) * g(k)))
        dense = sum(m_rows * n * k for m_rows, n, k in gemms) * t / b  # per sequence, all TP ranks
        work.append((layers * b * ((stack_flops(stack) + masked_flops(stack)) / layers / 6 - dense) / t,
                     ATTENTION_RATE))
    rows, vocab, width = b * predicted_tokens(cfg), m.padded_vocab / t, embedding_width(m)
    work.append((rows * vocab * width, g(rows) * g(vocab) * g(width)))
    return sum(w for w, _ in work) / sum(w / rate for w, rate in work)


def collectives(cfg: Config, n: int) -> list[tuple[str, float, str]]:
    """DeepSpeed's data-parallel collectives for `n` parameters per TP rank: (kind, bytes of the whole buffer, when),
    when = "micro" (every micro batch), "last" (once, during the last backward) or "after" (after the optimizer
    step). Gradients are all-reduced at ZeRO-0, under BF16_Optimizer and at ZeRO-1/2 by default (DeepSpeed's
    use_multi_rank_bucket_allreduce: each bucket all-reduced, this rank's part kept; off: one reduce per owner, a
    reduce-scatter's volume), reduce-scattered at ZeRO-3; ZeRO-1/2 gather the updated weights, ZeRO-3 gathers them
    for the forward and backward passes (`_zero3_gathers` times the model per micro batch)."""
    z = cfg.zero
    grads, weights = n * reduce_bytes(cfg), n * GRAD_BYTES[cfg.precision]
    if z.stage == 3:
        return [("all-gather", _zero3_gathers(cfg) * weights, "micro"), ("reduce-scatter", grads, "micro")]
    whole = z.stage == 0 or _bf16_optimizer(cfg) or _deepspeed_json(cfg).get("zero_optimization", {}).get(
        "use_multi_rank_bucket_allreduce", True)
    reduce = ("all-reduce" if whole else "reduce-scatter", grads, "micro" if z.stage == 2 else "last")
    return [reduce] + ([("all-gather", weights, "after")] if z.stage else [])


def _data_parallel(cfg: Config, hw: Hardware, eff: Efficiency, n: int, dp: int, accumulation: int,
                   compute: float, overlap: bool) -> tuple[float, float]:
    """(exposed, hidden) seconds of one step's data-parallel / ZeRO communication for `n` parameters per TP rank
    over `dp` ranks; `compute`: one micro batch's matmul time. Overlapped, a micro batch's collectives hide behind
    its backward (ZeRO-3, prefetching the next modules: behind all its compute), the last ones behind the last
    backward; the weight all-gather after the optimizer step never hides."""
    t = min(cfg.parallel.tp, hw.gpus_per_node)
    per_node = max(1, min(hw.gpus_per_node, dp * cfg.parallel.tp) // cfg.parallel.tp)
    seconds = {"micro": 0.0, "last": 0.0, "after": 0.0}
    for kind, nbytes, when in collectives(cfg, n):
        seconds[when] += _ring(kind, nbytes, dp, per_node, hw, eff, tp=t)
    backward = 2 / 3 * compute
    window = (compute if cfg.zero.stage == 3 else backward) if overlap else 0.0
    last = max(0.0, seconds["last"] - backward) if overlap else seconds["last"]
    exposed = accumulation * max(0.0, seconds["micro"] - window) + last + seconds["after"]
    return exposed, accumulation * seconds["micro"] + seconds["last"] + seconds["after"] - exposed


def _zero3_latency(cfg: Config, hw: Hardware, eff: Efficiency, dp: int) -> float:
    """Seconds one micro batch waits for the ring latency of ZeRO-3's per-layer collectives: each layer's weights are
    gathered by a collective of their own (`_zero3_gathers` times per micro batch, as in `collectives`) and its
    gradients reduce-scattered by another; `_data_parallel` counts their bytes as one buffer (one latency, hidden
    behind the compute where overlapped), this the latency of every other collective. The latency is not hidden: a
    layer's compute cannot start before its gather has completed, and every ring step of it (n - 1 over n ranks) is a
    handshake between neighbours that no bandwidth shortens. 0 below ZeRO-3 or on one rank."""
    if cfg.zero.stage != 3 or dp <= 1:
        return 0.0
    t = min(cfg.parallel.tp, hw.gpus_per_node)
    per_node = max(1, min(hw.gpus_per_node, dp * cfg.parallel.tp) // cfg.parallel.tp)
    layers = sum(stack.layers
                 for stack in stacks(cfg.model, cfg.data.seq_len, decoder_tokens(cfg), predicted_tokens(cfg)))
    gathers, reductions = _zero3_gathers(cfg) * layers - 1, layers - 1  # the one of each _data_parallel counts
    return (gathers * _ring("all-gather", 0.0, dp, per_node, hw, eff, tp=t)
            + reductions * _ring("reduce-scatter", 0.0, dp, per_node, hw, eff, tp=t))


def _zero3_gathers(cfg: Config) -> float:
    """Weight all-gathers per micro batch under ZeRO-3, in whole models. DeepSpeed releases gathered weights only if
    they are not used again within stage3_max_reuse_distance (D) parameters: a layer j layers below the top is used
    again (by its backward, or with activation checkpointing by its recomputed forward) after 2j layers' parameters,
    so the top ceil(D / 2 x layer) layers are gathered once, the others twice; a recomputed layer is gathered a third
    time only if its own parameters exceed D (its backward follows right after its recomputation)."""
    m = cfg.model
    distance = _deepspeed_json(cfg).get("zero_optimization", {}).get("stage3_max_reuse_distance", REUSE_DISTANCE)
    layer = (4 * m.hidden_size ** 2 + 2 * m.hidden_size * m.ffn_hidden_size) / cfg.parallel.tp
    kept = min(m.num_layers, math.ceil(distance / (2 * layer)))
    return 2 - kept / m.num_layers + (1 if checkpointed(m) and layer > distance else 0)


def _optimizer(cfg: Config, hw: Hardware, eff: Efficiency, updated: int) -> float:
    """Seconds of the optimizer step over the `updated` parameters of this rank; ZeRO-Offload steps on the CPU
    from host memory (shared by the node's GPUs) and moves gradients and weights over PCIe."""
    per_param = OPTIMIZER_BYTES[cfg.optimizer.name] + MIXED_PRECISION_BYTES[cfg.precision]
    if cfg.zero.offload:
        return (updated * per_param * hw.gpus_per_node / (hw.host_memory_gbps * 1e9 * eff.memory)
                + updated * (4 + GRAD_BYTES[cfg.precision]) / (hw.pcie_gbps * 1e9 * eff.link))
    return updated * per_param / (hw.hbm_gbps * 1e9 * eff.memory)


def calibrate(cfg: Config, hw: Hardware, world_size: int, samples_per_s: float, eff: Efficiency = Efficiency(),
              **kwargs) -> float:
    """The Efficiency.matmul under which `predict` gives `samples_per_s` (bisection); clipped to (0, 1]."""
    lo, hi = 1e-3, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if predict(cfg, hw, world_size, replace(eff, matmul=mid), **kwargs).samples_per_s < samples_per_s:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# ----------------------------------------------------------------------------------------------- reports

def ms(seconds: float) -> str:
    return f"{1e3 * seconds:,.1f} ms"


def _duration(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:,.1f} h ({hours / 24:,.1f} days)" if hours >= 48 else f"{hours:,.2f} h"


def _layout(p: Prediction, cfg: Config) -> str:
    return (f"global batch {p.samples_per_step} = micro batch {cfg.train.micro_batch_size} x data-parallel {p.dp} x "
            f"{p.accumulation} accumulation step{'s' if p.accumulation > 1 else ''}, tp {p.tp}, ZeRO-{cfg.zero.stage}, "
            f"{cfg.precision}, kernels={cfg.kernels_on(cuda=True)}")


def hardware_line(hw: Hardware, world: int, eff: Efficiency) -> str:
    net, eff = hw.network, eff.on(hw)
    nodes = math.ceil(world / hw.gpus_per_node)
    return (f"{world} x {hw.name} ({nodes} node{'s' if nodes > 1 else ''} of {hw.gpus_per_node}; NVLink "
            f"{hw.nvlink_gbps:g} GB/s per GPU, network {net.spec} = {net.bandwidth / 1e9:g} GB/s per node); "
            f"efficiencies matmul {eff.matmul:g}, memory {eff.memory:g}, link {eff.link:g}")


def _step_table(p: Prediction) -> list[str]:
    lines = []
    for part, seconds in p.parts().items():
        hidden = f" (+{ms(p.dp_comm_hidden)} hidden behind the compute)" if "ZeRO" in part and p.dp_comm_hidden else ""
        lines.append(f"  {part:<38}{ms(seconds):>14} {100 * seconds / p.device:6.1f}%{hidden}")
    lines.append(f"  {'device':<38}{ms(p.device):>14}")
    how = "counted" if p.launches_counted else "estimated from the layers; counted with --count-launches"
    lines.append(f"  {'host (kernel launches)':<38}{ms(p.host):>14}  {p.launches:,} launches ({how}) x "
                 f"{1e6 * p.launch_s:g} us")
    bound = "the host: the GPU waits for its kernels" if p.host > p.device else "the device"
    lines.append(f"  {'step':<38}{ms(p.step):>14}  bound by {bound}")
    return lines


def _train_time(cfg: Config, p) -> float:
    """Seconds to train train.steps at prediction `p`'s speed; with a batch ramp, its samples at the whole batch's
    samples/s (the ramp's smaller steps are slower per sample: a lower bound)."""
    if not cfg.train.batch_rampup:
        return cfg.train.steps * p.step
    return cfg.train.samples_before(cfg.train.steps) / p.samples_per_s


def report(cfg: Config, hw: Hardware, world: int, eff: Efficiency = Efficiency(),
           launches: Launches | None = None, at=None) -> str:
    """The speed section of `ptm plan --gpu`: the step by part, throughput, MFU, time to train, scaling;
    `launches`: counted (pretrain/launches.py), else estimated; `at(gpus)`: the config on that many GPUs (where
    train.micro_batch_size=auto picks the micro batch there), else `cfg` at every size."""
    p = predict(cfg, hw, world, eff, launches=launches)
    lines = [f"\npredicted speed on {hardware_line(hw, world, eff)}", f"one step ({_layout(p, cfg)}):",
             *_step_table(p), *[f"  note: {n}" for n in p.notes],
             f"throughput: {p.samples_per_s:,.1f} samples/s, {p.tokens_per_s:,.0f} tokens/s, MFU {100 * p.mfu:.1f}% "
             f"({p.mfu * p.peak / 1e12:,.0f} TFLOP/s per GPU)",
             f"time to train {cfg.train.steps:,} steps" + (f" ({cfg.train.samples_before(cfg.train.steps):,} samples: "
                                                          "the batch ramps)" if cfg.train.batch_rampup else "")
             + f": {_duration(_train_time(cfg, p))}"]
    nodes = math.ceil(world / hw.gpus_per_node)
    if nodes > 1:
        same = "the micro batch as auto picks it at each size" if at else "the same micro batch"
        lines.append(f"scaling with the same global batch, {same} (per-GPU throughput against 1 node):")
        lines.append(f"  {'nodes':>5} {'GPUs':>6} {'micro x acc':>12} {'samples/s':>12} {'MFU':>7} {'efficiency':>11} "
                     f"{'time to train':>16}")
        base, over = None, False
        for k in sorted({2 ** i for i in range(nodes.bit_length()) if 2 ** i <= nodes} | {nodes}):
            gpus = k * hw.gpus_per_node
            try:
                c = at(gpus) if at else cfg
                q = predict(c, hw, gpus, eff, launches=launches)
            except ConfigError as e:
                lines.append(f"  {k:>5} {gpus:>6}  {e}")
                continue
            base = base or q.samples_per_s / gpus
            split = f"{q.samples_per_step // (q.dp * q.accumulation)} x {q.accumulation}"
            lines.append(f"  {k:>5} {gpus:>6} {split:>12} {q.samples_per_s:>12,.1f} {100 * q.mfu:>6.1f}% "
                         f"{100 * q.samples_per_s / gpus / base:>10.1f}% {_duration(_train_time(cfg, q)):>16}")
            over = over or q.samples_per_s / gpus > base * (1 + 1e-9)
        if over:
            lines.append("  (over 100%: on more GPUs each holds and updates a smaller ZeRO share of the states: "
                         + ("a larger micro batch fits,\n   as auto picks it, and " if at else "")
                         + "the optimizer step is shorter)")
    else:
        lines.append("give --nodes M for the scaling from 1 node to M")
    return "\n".join(lines)


def measured(run_dir: str, since: int = 0, whole: int | None = None) -> dict:
    """What a ptm run measured since its last start (at step `since`: launch.json's layout): the median step time
    over its logged steps (the first two, compilation and warm-up, left out when there are more), samples/s and MFU
    at that step time; `whole`: only the steps of that global batch (a batch ramp's smaller steps left out)."""
    import statistics

    from pretrain.report import ReportError, log_rows

    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise ConfigError(f"{path} is missing: --check needs a ptm run's out_dir with at least one logged step")
    try:
        rows = [r for r in log_rows(path) if r["step"] > since]
    except ReportError as e:
        raise ConfigError(str(e)) from None
    if not rows:
        raise ConfigError(f"{path} holds no step after step {since}, where the run last started: --check needs a "
                          "ptm run's out_dir with at least one step logged by its last start")
    if whole is not None:
        rows = [r for r in rows if round(r["samples_per_s"] * r["step_time_s"]) == whole]
        if not rows:
            raise ConfigError(f"{path} holds no step of the whole global batch ({whole}) yet: train.batch_rampup's "
                              "smaller steps are not what --check predicts; check the run past its ramp")
    rows = rows[2:] if len(rows) > 2 else rows
    step = statistics.median(r["step_time_s"] for r in rows)
    mfus = [r["mfu"] for r in rows if "mfu" in r]
    return {"step_time_s": step, "steps": len(rows), "mfu": statistics.median(mfus) if mfus else None}


def check(run_dir: str, gpu_name: str | None, interconnect: str | None, eff: Efficiency, count=None,
          launch_us: float | None = None) -> str:
    """`ptm plan --check RUN_DIR`: the prediction for a run's config, GPUs and layout next to what it measured,
    and the matmul efficiency (the host's time per launch, where the host bounds the step) under which the prediction
    would equal the measured step time. `count`: pretrain/launches.py's `count`, to count the step's launches on the
    run's dataset (else estimated)."""
    import json

    from pretrain.config import load

    launch_path = os.path.join(run_dir, "launch.json")
    for path in (os.path.join(run_dir, "config.yaml"), launch_path):
        if not os.path.isfile(path):
            raise ConfigError(f"{path} is missing: --check needs the out_dir of a ptm run (ptm train writes it)")
    with open(launch_path) as f:
        launch = json.load(f)
    cfg = load(os.path.join(run_dir, "config.yaml"))
    if launch.get("cwd"):  # relative paths of the data, from where the run started
        paths = [os.path.join(launch["cwd"], p) for p in cfg.data.paths]
        cfg.data.path = paths[0] if isinstance(cfg.data.path, str) else paths
        cfg.data.similar_words = cfg.data.similar_words and os.path.join(launch["cwd"], cfg.data.similar_words)
    if gpu_name:
        hw = gpu(gpu_name, interconnect, launch["gpus_per_node"])
    else:
        hw = by_device_name(launch["device"])
        if hw is None:
            raise HardwareError(f"{run_dir} ran on {launch['device']!r}, which configs/hardware/gpus.yaml does not "
                                "describe; pass --gpu NAME or --gpu FILE.yaml with its peaks and bandwidths")
        hw = replace(hw, gpus_per_node=launch["gpus_per_node"],
                     network=network(interconnect) if interconnect is not None else hw.network)
    hw = replace(hw, launch_us=launch_us) if launch_us else hw
    world, eff = launch["world_size"], eff.on(hw)
    whole = cfg.train.global_batch_size if cfg.train.batch_rampup else None
    got = measured(run_dir, launch.get("first_step", 0), whole)
    counted = count(cfg)[0] if count else None
    p = predict(cfg, hw, world, eff, launches=counted)
    rows = [("step time", ms(p.step), ms(got["step_time_s"]), got["step_time_s"] / p.step),
            ("samples/s", f"{p.samples_per_s:,.1f}", f"{p.samples_per_step / got['step_time_s']:,.1f}",
             p.step / got["step_time_s"])]
    if got["mfu"] is not None:
        rows.append(("MFU", f"{100 * p.mfu:.1f}%", f"{100 * got['mfu']:.1f}%", got["mfu"] / p.mfu))
    lines = [f"{run_dir}: {launch['device']} x {world}, {_layout(p, cfg)}"
             + (f" (a CPU run: its measures are not {hw.name}'s, and the fits below do not apply to a GPU)"
                if launch["device"] == "cpu" else ""),
             f"predicted on {hardware_line(hw, world, eff)}:", *_step_table(p),
             f"  {'':<14}{'predicted':>14}{'measured':>14}{'measured/predicted':>20}  ({got['steps']} steps)"]
    lines += [f"  {name:<14}{a:>14}{b:>14}{ratio:>20.3f}" for name, a, b, ratio in rows]
    if p.host >= p.device:
        lines.append(f"the step is predicted bound by the host: the measured step time is predicted with --launch-us "
                     f"{1e6 * got['step_time_s'] / p.launches:.3g} (now {hw.launch_us:g})")
        return "\n".join(lines)
    fitted = calibrate(cfg, hw, world, p.samples_per_step / got["step_time_s"], eff, launches=counted)
    if 1e-3 < fitted < 1.0 - 1e-6:
        lines.append(f"the measured step time is predicted with --efficiency matmul={fitted:.4g} (now {eff.matmul:g})")
    else:
        lines.append(f"no matmul efficiency in (0, 1] predicts the measured step time: the other parts "
                     f"({'slower' if fitted >= 1 else 'faster'} than measured) are off; compare them above")
    return "\n".join(lines)
