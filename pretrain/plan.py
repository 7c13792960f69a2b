"""`ptm plan`: does a config fit per GPU, before launch? Memory by component, and the trainer's FLOPs/MFU.

    cfg = load("bert-large")
    plan = estimate(cfg, world_size=8, gpu_memory_gib=80)     # bytes per GPU, plan.fits, plan.max_micro_batch
    flops = model_flops_per_sample(cfg.model, cfg.data.seq_len, predicted_tokens(cfg))
    utilisation = mfu(flops * samples_per_second / num_gpus, torch.cuda.get_device_name(), cfg.precision)

Everything is computed from the config alone (no torch, no megatron import): parameter counts mirror
pretrain/models/model.py, model states follow DeepSpeed's ZeRO partitioning, activations follow Korthikanti
et al. 2022. docs/performance.md lists the assumptions.
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import os
import re
import sys
from dataclasses import dataclass

from data_prep import PrepError
from pretrain import objectives, speed
from pretrain.config import Config, ConfigError, load
from pretrain.models.config import ModelConfig, embedding_width, generator_config, padded_vocab_size

GIB = 1 << 30
MIG_SLICES = 7  # compute slices of a MIG-capable GPU in the catalog (A100, H100, H200)
CUDA_CONTEXT = GIB  # assumed: CUDA context, cuBLAS/NCCL workspaces, allocator slack
REDUCE_BUCKET = 500_000_000  # DeepSpeed's reduce_bucket_size (elements): one gradient bucket, allocated whole
DEFAULT_VOCAB = 30522  # BERT's WordPiece vocabulary, when neither config nor dataset gives one

# bytes per parameter: (weights, gradients, fp32 master copy); Adam and LAMB add fp32 moments m and v
STATE_BYTES = {"fp32": (4, 4, 0), "bf16": (2, 2, 4), "fp16": (2, 2, 4)}
MOMENT_BYTES = 8
OFFLOAD_BYTES = 16  # per parameter of a ZeRO-Offload shard in CPU memory: fp32 weights, fp32 gradients, moments
CHECKPOINT_BYTES = 12  # per parameter in a ptm checkpoint: fp32 weights and both moments
SHA256_GBPS = 1.0  # each writer hashes its files after writing them (meta.json records them)

# ------------------------------------------------------------------------------------------ parameters

def _modules(m: ModelConfig, shared_embeddings: bool = False) -> list[tuple[int, int]]:
    """(TP-split, replicated) counts of the parameters each module of `Pretraining(m)` owns directly; a shared
    layer (share_layers) once; `shared_embeddings`: the tables and their LayerNorm belong to another model (ELECTRA's
    generator reads the discriminator's)."""
    h, f, v, e = m.hidden_size, m.ffn_hidden_size, padded_vocab_size(m), embedding_width(m)
    positions = 0 if m.position_encoding == "relative" else m.max_position_embeddings  # NEZHA's are functions
    tables = [(v * e, 0), (0, positions * e), (0, m.type_vocab_size * e), (0, m.task_type_vocab_size * e)]
    embeddings = ([] if shared_embeddings else tables) + ([(0, e * h + h)] if e != h else [])  # ALBERT's projection
    norms = [(0, 2 * h), (0, 2 * h)]
    attention = [(3 * h * h + 3 * h, 0), (h * h, h)]  # QKV (column), output (row: bias replicated)
    mlp = [(f * h + f, 0), (f * h, h)]  # fc1 (column), fc2 (row)
    if m.share_layers == "all":
        blocks = norms + attention + mlp
    else:
        shared = {"attention": attention, "ffn": mlp}.get(m.share_layers, [])
        blocks = (norms + (attention if m.share_layers != "attention" else [])
                  + (mlp if m.share_layers != "ffn" else [])) * m.num_layers + shared
    # the embedding LayerNorm (post-LN; a shared one belongs to the other model) or the final one (pre-LN)
    heads = [] if shared_embeddings and m.norm == "post" else [(0, 2 * (e if m.norm == "post" else h))]
    if "mlm" in m.heads:  # MLM bias (vocab-split), transform dense and LayerNorm; "lm" is the word embeddings
        heads += [(v, 0), (0, h * e + e), (0, 2 * e)]
    if "nsp" in m.heads:  # pooler, NSP/SOP classifier
        heads += [(0, h * h + h), (0, 2 * h + 2)]
    if "rtd" in m.heads:  # the discriminator head, and the generator on the shared embeddings
        heads += [(0, h * h + h), (0, h + 1)] + _modules(generator_config(m), shared_embeddings=True)
    return embeddings + blocks + heads


def count_parameters(m: ModelConfig, tp: int = 1) -> int:
    """Parameters of `Pretraining(m)` on one of `tp` tensor-parallel ranks (tp=1: the whole model). Split over
    TP: word embeddings, QKV/output/MLP weights, column biases, the MLM bias; the rest is replicated. ELECTRA's
    generator is counted with its discriminator, their shared embeddings once. ERNIE 2.0's task heads (a few thousand parameters, added by the trainer) are not counted."""
    return sum(split // tp + replicated for split, replicated in _modules(m))


def largest_module(m: ModelConfig, tp: int = 1) -> int:
    """Parameters of the biggest single module on one TP rank (usually the word embeddings): what ZeRO-3
    gathers at once (DeepSpeed's `largest_layer_params`)."""
    return max(split // tp + replicated for split, replicated in _modules(m))


# --------------------------------------------------------------------------------------------- FLOPs

def predicted_tokens(cfg: Config) -> int:
    """Tokens per sequence the LM head runs on: all for causal LM, the masked positions for masked LM."""
    return objectives.get(cfg.data.objective).predicted_tokens(cfg.data)


def model_flops_per_sample(m: ModelConfig, seq_len: int, predicted: int | None = None) -> float:
    """Training FLOPs of one sequence: forward + backward = 3 x forward (2 FLOPs per multiply-add), activation
    recomputation not counted (model FLOPs, not hardware FLOPs). With s = seq_len, L layers, hidden h, MLP
    width f, padded vocabulary V and p = `predicted` tokens (default s):

        6 * s * L * (4h^2 + 2hf)      block matmuls: QKV, attention output, MLP
      + 12 * L * h * s^2              attention scores QK^T and P @ V over the full s x s square
                                      (causal masking's halving is not applied, as in Megatron and nanoGPT);
                                      twice that with relative positions (NEZHA: q . a_ij and P . a_ij too)
      + 6 * p * e * V                 LM head logits on the predicted tokens (e: the embedding width, = h
                                      unless factorised as ALBERT's)
      + 6 * p * h * e                 with an mlm head: its transform dense on the predicted tokens
      + 6 * s * e * h                 with e != h: the embedding projection
      + 6 * s * (h^2 + h)             with an rtd head (ELECTRA) instead of the LM head: the discriminator head on
                                      every token, plus the generator's FLOPs (this formula, its own sizes)

    For f = 4h and p = s this is Megatron's 72*s*L*h^2 * (1 + s/(6h) + V/(12*L*h)). Embedding lookups, norms,
    softmax, biases and the pooler/NSP head (one token per sequence) are left out."""
    h, s, p, e = m.hidden_size, seq_len, seq_len if predicted is None else predicted, embedding_width(m)
    layers = m.num_layers * layer_flops_per_sample(m, s)  # every layer, shared or not
    projection = 6 * s * e * h if e != h else 0  # ALBERT's embedding projection
    if "rtd" in m.heads:
        return float(layers + projection + 6 * s * (h * h + h)) + model_flops_per_sample(
            generator_config(m), seq_len, predicted)
    head = 6 * p * e * (padded_vocab_size(m) + (h if "mlm" in m.heads else 0))
    return float(layers + head + projection)


def layer_flops_per_sample(m: ModelConfig, seq_len: int) -> int:
    """Training FLOPs of one transformer layer on one sequence: its matmuls 6*s*(4h^2 + 2hf) and attention
    12*h*s^2 (doubled with relative positions); see model_flops_per_sample."""
    h, s = m.hidden_size, seq_len
    return 6 * s * (4 * h * h + 2 * h * m.ffn_hidden_size) + 12 * h * s * s * (
        2 if m.position_encoding == "relative" else 1)


def peak_flops(device_name: str, precision: str) -> float | None:
    """Dense peak FLOPs/s of a GPU named like `torch.cuda.get_device_name()` (configs/hardware/gpus.yaml), or of the
    MIG slice of one so named; None if unknown (or a CPU)."""
    hw = speed.by_device_name(device_name)
    peak = None if hw is None else hw.peak(precision)
    return None if peak is None else peak * mig_share(device_name)


def mig_share(device_name: str) -> float:
    """The share of its GPU's compute a MIG slice has: "NVIDIA A100-SXM4-80GB MIG 3g.40gb" is 3 of the 7 compute
    slices of an A100/H100/H200, "... MIG 1c.3g.40gb" (a compute instance in it) 1 of 7; 1 for a whole GPU."""
    m = re.search(r"\bMIG (?:(\d+)c\.)?(\d+)g\.", device_name)
    return 1.0 if m is None else int(m.group(1) or m.group(2)) / MIG_SLICES


def mfu(flops_per_second: float, device_name: str, precision: str) -> float | None:
    """Model FLOPs utilisation of one GPU: its achieved model FLOPs/s over the device's peak."""
    peak = peak_flops(device_name, precision)
    return None if peak is None else flops_per_second / peak


# -------------------------------------------------------------------------------------------- memory

COMPONENTS = {"weights": "weights", "gradients": "gradients", "optimizer_states": "optimizer states",
              "zero3_gathered": "ZeRO-3 gathered module", "activations": "activations", "logits": "logits",
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
    buffers: int  # CUDA context and the gradient reduce bucket
    cpu_offload: int  # CPU memory per GPU process (ZeRO-Offload)
    gpu_memory: int | None = None  # capacity checked against
    max_micro_batch: int | None = None  # the largest micro batch that fits gpu_memory

    @property
    def total(self) -> int:
        return sum(getattr(self, name) for name in COMPONENTS)

    @property
    def fits(self) -> bool | None:
        return None if self.gpu_memory is None else self.total <= self.gpu_memory


def model_state_bytes(n: int, dp: int, stage: int, offload: bool, precision: str) -> tuple[int, int, int, int]:
    """(weights, gradients, optimizer states) bytes per GPU and CPU bytes per GPU process, for `n` parameters
    per TP rank under ZeRO `stage` over `dp` ranks: stage 1 partitions optimizer states, 2 also gradients,
    3 also weights. Offload moves the optimizer states to CPU memory, and from stage 2 the gradient partition
    too (the CPU optimizer steps on an fp32 copy of it)."""
    weight, grad, master = STATE_BYTES[precision]

    def per_gpu(nbytes: int, partitioned: bool) -> int:
        return nbytes * n // dp if partitioned else nbytes * n

    gradients = 0 if offload and stage >= 2 else per_gpu(grad, stage >= 2)
    optimizer = 0 if offload else per_gpu(master + MOMENT_BYTES, stage >= 1)
    cpu = per_gpu(OFFLOAD_BYTES, True) if offload else 0
    return per_gpu(weight, stage >= 3), gradients, optimizer, cpu


def _checkpointed(m: ModelConfig) -> int:
    """How many layers `model.activation_checkpointing` recomputes."""
    return m.num_layers if m.activation_checkpointing is True else len(set(m.activation_checkpointing or ()))


def activation_bytes(cfg: Config, micro_batch: int) -> tuple[int, int]:
    """(transformer layers, logits) activation bytes per GPU. A layer keeps s*b*h*(10 + 24/t + 5*a*s/(h*t))
    bytes in 16 bits (Korthikanti et al. 2022, tensor parallelism without sequence parallelism; 24 is 8 + 4f/h
    for an MLP of width f), double in fp32. A checkpointed layer keeps only its input (2*s*b*h), and one
    layer's full activations live again during its recomputation. Logits: fp32, over this rank's vocabulary."""
    m, s, t, b = cfg.model, cfg.data.seq_len, cfg.parallel.tp, micro_batch
    scale = 2 if cfg.precision == "fp32" else 1
    layers = 0
    for model in (m, generator_config(m)) if "rtd" in m.heads else (m,):  # ELECTRA: the generator's layers too
        h = model.hidden_size
        layer = scale * s * b * (10 * h + (8 * h + 4 * model.ffn_hidden_size + 5 * model.num_heads * s) // t)
        checkpointed, kept = _checkpointed(model), scale * 2 * s * b * h
        layers += (model.num_layers - checkpointed) * layer + checkpointed * kept + (layer if checkpointed else 0)
    logits = 4 * b * predicted_tokens(cfg) * padded_vocab_size(m) // t
    return layers, logits


def estimate(cfg: Config, world_size: int, gpu_memory_gib: float | None = None) -> Plan:
    """Memory per GPU of training `cfg` on `world_size` GPUs, and the largest micro batch that fits
    `gpu_memory_gib` (when given). Raises ConfigError for a config that would not start."""
    m, z, tp = cfg.model, cfg.zero, cfg.parallel.tp
    dp = _data_parallel_size(cfg, world_size)
    n = count_parameters(m, tp)
    weights, gradients, optimizer, cpu = model_state_bytes(n, dp, z.stage, z.offload, cfg.precision)
    weight, grad, _ = STATE_BYTES[cfg.precision]
    gathered = (weight + grad) * largest_module(m, tp) if z.stage == 3 else 0
    activations, logits = activation_bytes(cfg, cfg.train.micro_batch_size)
    plan = Plan(params=count_parameters(m), params_per_rank=n, tp=tp, dp=dp, weights=weights, gradients=gradients,
                optimizer_states=optimizer, zero3_gathered=gathered, activations=activations, logits=logits,
                buffers=CUDA_CONTEXT + REDUCE_BUCKET * grad, cpu_offload=cpu)
    if gpu_memory_gib is not None:
        plan.gpu_memory = int(gpu_memory_gib * GIB)
        per_sample = sum(activation_bytes(cfg, 1))  # activations and logits grow linearly with the micro batch
        plan.max_micro_batch = max(0, (plan.gpu_memory - plan.total + activations + logits) // per_sample)
    return plan


def _data_parallel_size(cfg: Config, world_size: int) -> int:
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
    probe.validate(world_size // tp)
    return world_size // tp


# ------------------------------------------------------------------------------------------------- CLI


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--config", help="YAML file, or a preset name from configs/ (bert-large, gpt2-xl, ernie-base, ...); "
                                     "required unless --check")
    ap.add_argument("--set", dest="overrides", metavar="KEY=VALUE", nargs="+", action="extend", default=[],
                    help="override config keys, e.g. --set zero.stage=3 train.micro_batch_size=32 parallel.tp=2")
    ap.add_argument("--gpus", type=int, metavar="N",
                    help="GPUs of the whole run (world size); data-parallel size = N / parallel.tp (default: "
                         "--nodes x GPUs per node with --gpu, else 1)")
    ap.add_argument("--gpu-memory", type=float, metavar="GIB",
                    help="memory of one GPU in GiB, e.g. 80 (H100/A100 80GB), 40, 16 (default: --gpu's); without "
                         "either no fit verdict")
    ap.add_argument("--vocab-size", type=int, metavar="N",
                    help="vocabulary size when model.vocab_size is 0 (the dataset's) and data.path holds no "
                         f"dataset (default {DEFAULT_VOCAB})")
    ap.add_argument("--gpu", metavar="NAME|FILE",
                    help="predict the training speed on this GPU: " + ", ".join(speed.catalog_names())
                         + " (configs/hardware/gpus.yaml), or a YAML file of your GPU's fields")
    ap.add_argument("--nodes", type=int, metavar="M",
                    help="nodes of the run, with --gpu: --gpus defaults to M x GPUs per node; the speed report "
                         "shows the scaling from 1 node to M (default 1)")
    ap.add_argument("--interconnect", metavar="SPEC",
                    help="the network between nodes as NICSxNAME or NICSxGBIT per node, e.g. 8xhdr, 8xndr, 4xedr, "
                         "2x100gbe, 8x200 (default: --gpu's usual node)")
    ap.add_argument("--efficiency", metavar="KEY=VALUE", nargs="+", action="extend", default=[],
                    help="override the speed model's achieved fractions of peak: matmul (of the tensor-core FLOP/s), "
                         "memory (of HBM bandwidth), link (of NVLink/NIC bandwidth); defaults in docs/performance.md")
    ap.add_argument("--compare", action="store_true",
                    help="with --gpu: rank the layouts that fit (tp x ZeRO stage x micro batch x activation "
                         "checkpointing) by predicted step time, with why each is slower than the first; without "
                         "--gpu: ZeRO stages 0-3 side by side")
    ap.add_argument("--check", metavar="RUN_DIR",
                    help="put the prediction for a finished or running ptm run (its config.yaml, launch.json and "
                         "metrics.jsonl) next to the step time and MFU it measured, and the matmul efficiency that "
                         "would match it")
    ap.add_argument("--gpus-per-node", type=int, metavar="G",
                    help="GPUs (processes) per node, for the checkpoint written per node and the speed model "
                         "(default: --gpu's node, else 8)")
    ap.add_argument("--write-gbps", type=float, default=1.0, metavar="GB/S",
                    help="write bandwidth of one node to the checkpoint filesystem in GB/s, for the checkpoint time "
                         "and the Slurm warning lead time (default 1.0)")


DESCRIPTION = ("Estimate the memory per GPU of a training config before launch: weights, gradients and optimizer "
               "states under ZeRO, activations, logits and buffers; whether it fits --gpu-memory, the largest "
               "micro batch that does, and changes that would make it fit. With --gpu: the predicted step time by "
               "part (compute, memory-bound kernels, tensor- and data-parallel communication, optimizer), samples/s, "
               "tokens/s, MFU, time to train and the scaling over --nodes. Exit status: 0 fits (or no memory "
               "given), 1 does not fit, 2 bad config. Assumptions and checks against published runs: "
               "docs/performance.md.")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m pretrain plan", description=DESCRIPTION)
    add_arguments(ap)
    sys.exit(run(ap.parse_args(argv)))


def run(args: argparse.Namespace) -> int:
    """The report for parsed `plan` arguments; returns the exit status."""
    try:
        efficiency = speed.efficiency(args.efficiency)
        if args.check:
            print(speed.check(args.check, args.gpu, args.interconnect, efficiency))
            return 0
        if not args.config:
            raise ConfigError("give --config CONFIG (or --check RUN_DIR)")
        cfg = load(args.config, args.overrides)
        vocab_source = _resolve_vocab(cfg, args.vocab_size)
        per_node = args.gpus_per_node
        if args.gpus and args.nodes:  # both: the GPUs split evenly over the nodes
            if args.gpus % args.nodes or (per_node and per_node * args.nodes != args.gpus):
                raise ConfigError(f"--gpus {args.gpus} do not make --nodes {args.nodes} of equal size"
                                  + (f" x {per_node}" if per_node else "") + "; give two of them")
            per_node = args.gpus // args.nodes
        hw = speed.gpu(args.gpu, args.interconnect, per_node) if args.gpu else None
        per_node = hw.gpus_per_node if hw else per_node or 8
        world = args.gpus or ((args.nodes or 1) * per_node if hw or args.nodes else 1)
        memory = args.gpu_memory or (hw.memory_gib if hw else None)
        plan = estimate(cfg, world, memory)
        predicted = speed.report(cfg, hw, world, efficiency) if hw else ""  # a layout it refuses stops here
        print(_header(args.config, cfg, plan, vocab_source, world))
        if args.compare and hw:
            print(speed.ranking(cfg, hw, world, efficiency, memory))
        elif args.compare:
            stages = {f"ZeRO-{s}": _variant(cfg, {"zero.stage": s, "zero.offload": cfg.zero.offload and s > 0})
                      for s in range(4)}
            print(_table({name: estimate(c, world, memory) for name, c in stages.items()}))
        else:
            print(_table({"GiB/GPU": plan}))
        print(_verdict(cfg, plan, world))
        print(_checkpoint_time(cfg, plan, world, per_node, args.write_gbps))
        if predicted:
            print(predicted)
    except (ConfigError, PrepError) as e:
        print("\n".join(f"plan: error: {line}" for line in str(e).splitlines()), file=sys.stderr)
        return 2
    return 1 if plan.fits is False else 0


def _resolve_vocab(cfg: Config, vocab_size: int | None) -> str:
    """Fill in model.vocab_size when the config leaves it to the dataset; returns where it came from."""
    m, path = cfg.model, cfg.data.paths[0] if cfg.data.paths else ""
    if m.vocab_size:
        return "config"
    if vocab_size:
        m.vocab_size = vocab_size
        return "--vocab-size"
    if path and os.path.isfile(os.path.join(path, "manifest.json")):
        from data_prep.dataset import Corpus

        m.vocab_size = Corpus(path).vocab_size
        return f"dataset {path}"
    m.vocab_size = DEFAULT_VOCAB
    return "default; set --vocab-size"


def _variant(cfg: Config, changes: dict) -> Config:
    """A copy of `cfg` with dotted keys changed."""
    new = copy.deepcopy(cfg)
    for key, value in changes.items():
        *section, name = key.split(".")
        setattr(functools.reduce(getattr, section, new), name, value)
    return new


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f}"


def _header(name: str, cfg: Config, plan: Plan, vocab_source: str, world: int) -> str:
    m, z, d = cfg.model, cfg.zero, cfg.data
    flops = model_flops_per_sample(m, d.seq_len, predicted_tokens(cfg))
    return (f"{name}: {m.arch}, {plan.params / 1e6:.1f}M parameters ({plan.params_per_rank / 1e6:.1f}M per "
            f"TP rank), vocabulary {m.vocab_size} ({vocab_source})\n"
            f"{world} GPUs = tp {plan.tp} x dp {plan.dp}, ZeRO-{z.stage}{' + offload' if z.offload else ''}, "
            f"{cfg.precision}, micro batch {cfg.train.micro_batch_size} x {d.seq_len} tokens, "
            f"activation checkpointing {_checkpointed(m)}/{m.num_layers} layers\n"
            f"training FLOPs per sequence: {flops:.3e} (forward + backward, no recomputation)\n")


def _table(plans: dict[str, Plan]) -> str:
    """One row per component, one column per plan, in GiB per GPU."""
    rows = [("", *plans)]
    rows += [(label, *(_gib(getattr(p, name)) for p in plans.values())) for name, label in COMPONENTS.items()]
    rows.append(("total", *(_gib(p.total) for p in plans.values())))
    if any(p.cpu_offload for p in plans.values()):
        rows.append(("CPU memory per GPU (offload)", *(_gib(p.cpu_offload) for p in plans.values())))
    if len(plans) > 1 and next(iter(plans.values())).gpu_memory is not None:
        rows.append(("fits", *("yes" if p.fits else "no" for p in plans.values())))
        rows.append(("largest micro batch", *(str(p.max_micro_batch) for p in plans.values())))
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{r[0]:<{width}}" + "".join(f"{c:>10}" for c in r[1:]) for r in rows)


def _verdict(cfg: Config, plan: Plan, world_size: int) -> str:
    if plan.fits is None:
        return "\ngive --gpu-memory GIB to check the fit and find the largest micro batch"
    capacity, largest = f"{plan.gpu_memory / GIB:g} GiB", f"largest micro batch that fits: {plan.max_micro_batch}"
    if plan.fits:
        return (f"\nfits in {capacity}: {_gib(plan.total)} GiB per GPU, headroom "
                f"{_gib(plan.gpu_memory - plan.total)} GiB; {largest}")
    lines = [f"\ndoes not fit in {capacity}: {_gib(plan.total)} GiB per GPU, "
             f"{_gib(plan.total - plan.gpu_memory)} GiB over; {largest}", "suggestions (GiB per GPU after the change):"]
    for changes, after in _suggestions(cfg, plan, world_size):
        sets = " ".join(f"{k}={json.dumps(v)}" for k, v in changes.items())
        lines.append(f"  --set {sets:<48} {_gib(after.total):>8}  {'fits' if after.fits else 'still over'}")
    return "\n".join(lines)


def checkpoint_bytes(cfg: Config, plan: Plan) -> tuple[float, int]:
    """(bytes one writing process writes, processes that write): fp32 weights and two moments of its TP shard, split
    over the data-parallel ranks under ZeRO, written by data-parallel rank 0 alone without it (pretrain/checkpoint.py)."""
    per_shard = CHECKPOINT_BYTES * plan.params_per_rank
    return (per_shard / plan.dp, plan.tp * plan.dp) if cfg.zero.stage else (per_shard, plan.tp)


def _checkpoint_time(cfg: Config, plan: Plan, world_size: int, gpus_per_node: int, write_gbps: float) -> str:
    """The checkpoint a node writes, its time at `write_gbps` (plus hashing at SHA256_GBPS per process), and the
    --signal lead time that leaves room for it and a step."""
    per_process, writers = checkpoint_bytes(cfg, plan)
    per_node = per_process * min(gpus_per_node, writers)
    seconds = per_node / (write_gbps * 1e9) + per_process / (SHA256_GBPS * 1e9)
    lead = max(120, math.ceil((2 * seconds + 60) / 30) * 30)
    return (f"\ncheckpoint: {_gib(per_process * writers)} GiB in all, up to {_gib(per_node)} GiB per node of "
            f"{gpus_per_node} GPUs: about {seconds:.0f} s at {write_gbps:g} GB/s per node; ask Slurm for the warning "
            f"at least that plus one step before the time limit: sbatch --signal=USR1@{lead} (slurm/pretrain.sbatch)")


def _suggestions(cfg: Config, plan: Plan, world_size: int) -> list[tuple[dict, Plan]]:
    """Single changes that lower the memory per GPU, those that fit first."""
    m, z, t, tp = cfg.model, cfg.zero, cfg.train, cfg.parallel.tp
    candidates = [{"zero.stage": s} for s in range(z.stage + 1, 4)]
    # a smaller micro batch that still divides the global batch (gradient accumulation makes up the rest)
    smaller = [b for b in range(plan.max_micro_batch, 0, -1) if t.global_batch_size % (b * plan.dp) == 0]
    if smaller and smaller[0] < t.micro_batch_size:
        candidates.append({"train.micro_batch_size": smaller[0]})
    if m.activation_checkpointing is not True:
        candidates.append({"model.activation_checkpointing": True})
    if world_size % (2 * tp) == 0:
        candidates.append({"parallel.tp": 2 * tp})
    if not z.offload:
        candidates.append({"zero.stage": max(z.stage, 1), "zero.offload": True})
    found = []
    for changes in candidates:
        try:
            after = estimate(_variant(cfg, changes), world_size, plan.gpu_memory / GIB)
        except ConfigError:  # e.g. a TP size that does not divide the heads
            continue
        if after.total < plan.total:
            found.append((changes, after))
    return sorted(found, key=lambda item: (not item[1].fits, item[1].total))


if __name__ == "__main__":
    main()
