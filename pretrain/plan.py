"""`ptm plan`: does a config fit per GPU, before launch? Memory by component, the checkpoint it writes, and with
--gpu the predicted speed (pretrain/speed.py) and the layouts ranked.

    cfg = load("bert-large")
    plan = estimate(cfg, world_size=8, gpu_memory_gib=80)     # bytes per GPU, plan.fits, plan.max_micro_batch

Everything is computed from the config alone (no torch, no megatron import): memory by pretrain/memory.py, speed by
pretrain/speed.py; docs/performance.md lists the assumptions.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import math
import os
import sys

from data_prep import PrepError
from pretrain import hardware, speed
from pretrain.config import AUTO, Config, ConfigError, load
from pretrain.cost import Launches, checkpointed, estimate_launches, flops_per_sample
from pretrain.memory import COMPONENTS, GIB, HEADROOM, Plan, estimate, with_micro_batch
from ptm.cli import positive, whole

DEFAULT_VOCAB = 30522  # BERT's WordPiece vocabulary, when neither config nor dataset gives one
CHECKPOINT_BYTES = 12  # per parameter in a ptm checkpoint: fp32 weights and both moments
SHA256_GBPS = 1.0  # each writer hashes its files after writing them (meta.json records them)


# ------------------------------------------------------------------------------------------------- CLI

def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--config",
                    help="YAML file, or a preset name from configs/ (bert-large, gpt2-xl, ernie-base, ...); "
                         "required unless --check")
    ap.add_argument("--set", dest="overrides", metavar="KEY=VALUE", nargs="+", action="extend", default=[],
                    help="override config keys, e.g. --set zero.stage=3 train.micro_batch_size=32 parallel.tp=2")
    ap.add_argument("--gpus", type=whole("a count (1, 2, ...)"), metavar="N",
                    help="GPUs of the whole run (world size); data-parallel size = N / parallel.tp (default: "
                         "--nodes x GPUs per node with --gpu, else 1)")
    ap.add_argument("--gpu-memory", type=positive("a size in GiB (e.g. 80)"), metavar="GIB",
                    help="memory of one GPU in GiB, e.g. 80 (H100/A100 80GB), 40, 16 (default: --gpu's); without "
                         "either no fit verdict")
    ap.add_argument("--vocab-size", type=whole("a number of pieces (e.g. 32000)"), metavar="N",
                    help="vocabulary size when model.vocab_size is 0 (the dataset's) and data.path holds no "
                         f"dataset (default {DEFAULT_VOCAB})")
    ap.add_argument("--gpu", metavar="NAME|FILE",
                    help="predict the training speed on this GPU: " + ", ".join(hardware.catalog_names())
                         + " (configs/hardware/gpus.yaml), or a YAML file of your GPU's fields")
    ap.add_argument("--nodes", type=whole("a count (1, 2, ...)"), metavar="M",
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
    ap.add_argument("--count-launches", action="store_true",
                    help="with --gpu or --check: count the kernel launches of a step (the host's work) by training "
                         "a few steps of the config narrowed to a tiny width on data.path, on this machine (a CPU "
                         "will do; about a minute) instead of estimating them from the layers")
    ap.add_argument("--launch-us", type=positive("a time in microseconds (e.g. 20)"), metavar="US",
                    help="the host's time per kernel launch in microseconds, for the host term of the step "
                         "(default: the GPU generation's, configs/hardware/gpus.yaml; --calibrate measures yours)")
    ap.add_argument("--calibrate", action="store_true",
                    help="measure this node's host time per kernel launch: train a few steps of the config "
                         "narrowed to a tiny width on data.path on this node's device (a GPU's steps are then bound "
                         "by the host), count their launches and print the --launch-us to give")
    ap.add_argument("--gpus-per-node", type=whole("a count (1, 2, ...)"), metavar="G",
                    help="GPUs (processes) per node, for the checkpoint written per node and the speed model "
                         "(default: --gpu's node, else 8)")
    ap.add_argument("--write-gbps", type=positive("a bandwidth in GB/s (e.g. 1.0)"), default=1.0, metavar="GB/S",
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
        efficiency = hardware.efficiency(args.efficiency)
        if args.check:
            print(speed.check(args.check, args.gpu, args.interconnect, efficiency,
                              _count if args.count_launches else None, args.launch_us))
            return 0
        if not args.config:
            raise ConfigError("give --config CONFIG (or --check RUN_DIR)")
        unused = [o for o, given in (("--interconnect", args.interconnect is not None), ("--launch-us", args.launch_us),
                                     ("--count-launches", args.count_launches)) if given]
        if unused and not args.gpu:
            raise ConfigError(f"{', '.join(unused)} {'is' if len(unused) == 1 else 'are'} for the speed prediction, "
                              "which --gpu asks for: add --gpu NAME (h100, a100-80gb, ...)")
        cfg = load(args.config, args.overrides)
        if args.calibrate:
            print(_calibrate(args.config, cfg))
            return 0
        vocab_source = resolve_vocab(cfg, args.vocab_size)
        per_node = args.gpus_per_node
        if args.gpus and args.nodes:  # both: the GPUs split evenly over the nodes
            if args.gpus % args.nodes or (per_node and per_node * args.nodes != args.gpus):
                raise ConfigError(f"--gpus {args.gpus} do not make --nodes {args.nodes} of equal size"
                                  + (f" x {per_node}" if per_node else "") + "; give two of them")
            per_node = args.gpus // args.nodes
        hw = hardware.gpu(args.gpu, args.interconnect, per_node) if args.gpu else None
        if hw and args.launch_us:
            hw = dataclasses.replace(hw, launch_us=args.launch_us)
        per_node = hw.gpus_per_node if hw else per_node or 8
        world = args.gpus or ((args.nodes or 1) * per_node if hw or args.nodes else 1)
        if world % cfg.parallel.tp and not (args.gpus or args.nodes or hw):
            raise ConfigError(f"parallel.tp={cfg.parallel.tp} needs more than the 1 GPU plan counts without --gpus; "
                              f"give --gpus N (a multiple of {cfg.parallel.tp}) or --gpu NAME")
        memory = args.gpu_memory or (hw.memory_gib if hw else None)
        picked, asked = cfg.train.micro_batch_size == AUTO, cfg
        cfg = with_micro_batch(cfg, world, memory)  # as a run picks it on GPUs of this memory
        plan = estimate(cfg, world, memory)
        launches = _count(cfg)[0] if hw and args.count_launches else None
        at = (lambda gpus: with_micro_batch(asked, gpus, memory)) if picked else None  # auto at each size
        predicted = speed.report(cfg, hw, world, efficiency, launches, at) if hw else ""  # a refused layout stops here
        print(_header(args.config, cfg, plan, vocab_source, world, picked and memory))
        print("".join(f"note: {line}\n" for line in asked.ignored()), end="")  # what the run's log will say too
        if args.compare and hw:
            print(ranking(cfg, hw, world, efficiency, memory, launches))
        elif args.compare:
            stages = {f"ZeRO-{s}": _variant(cfg, {"zero.stage": s, "zero.offload": cfg.zero.offload and s > 0})
                      for s in range(4)}
            print(_table({name: estimate(c, world, memory) for name, c in stages.items()}))
        else:
            print(_table({"GiB/GPU": plan}))
        print(_verdict(cfg, plan, world))
        print(_checkpoint_time(cfg, plan, per_node, args.write_gbps))
        if predicted:
            print(predicted)
    except (ConfigError, PrepError) as e:
        print("\n".join(f"plan: error: {line}" for line in str(e).splitlines()), file=sys.stderr)
        return 2
    return 1 if plan.fits is False else 0


def _count(cfg: Config):
    """pretrain/launches.py's count (imported here: it brings torch, which `ptm plan` does not need otherwise)."""
    from pretrain.launches import count

    return count(cfg)


def _calibrate(name: str, cfg: Config) -> str:
    """`ptm plan --calibrate`: this node's host time per kernel launch, from narrowed steps of `cfg` on its device."""
    from pretrain.launches import ACCUMULATION, calibrate

    launches, seconds, device = calibrate(cfg)
    return (f"{name} narrowed to a tiny width on {device}: {launches.of(ACCUMULATION):,} kernel launches "
            f"a step of {ACCUMULATION} micro-batches ({launches.first:,} in the first, {launches.per_micro_batch:,} in "
            f"each further one, {launches.optimizer:,} at the step's end), {1e6 * seconds:.3g} us of host time each\n"
            f"give --launch-us {1e6 * seconds:.3g} to `ptm plan --gpu` for runs launched from this node's kind"
            + ("\nnote: measured without a GPU, so not what a GPU node's host takes; run --calibrate on one"
               if str(device).startswith("cpu") else ""))


def resolve_vocab(cfg: Config, vocab_size: int | None) -> str:
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


def _header(name: str, cfg: Config, plan: Plan, vocab_source: str, world: int, auto: float | None | bool) -> str:
    """`auto`: the GPU memory train.micro_batch_size=auto was picked for (None: none given; False: not auto)."""
    m, z, d = cfg.model, cfg.zero, cfg.data
    picked = "" if auto is False else (f" (auto: {HEADROOM:.0%} of {auto:g} GiB)" if auto else
                                       " (auto: the whole batch per rank; give --gpu or --gpu-memory to fit one)")
    flops = flops_per_sample(cfg)
    return (f"{name}: {m.arch}, {plan.params / 1e6:.1f}M parameters ({plan.params_per_rank / 1e6:.1f}M per "
            f"TP rank), vocabulary {m.vocab_size} ({vocab_source})\n"
            f"{world} GPUs = tp {plan.tp} x dp {plan.dp}, ZeRO-{z.stage}{' + offload' if z.offload else ''}, "
            f"{cfg.precision}, micro batch {cfg.train.micro_batch_size}{picked} x {d.seq_len} tokens, "
            f"activation checkpointing {checkpointed(m)}/{m.num_layers} layers\n"
            f"training FLOPs per sequence: {flops:.3e} (forward + backward{', the teacher forward' if plan.teacher_params else ''}"
            f", no recomputation)\n"
            + (f"teacher: {plan.teacher_params / 1e6:.1f}M parameters per TP rank, frozen\n" if plan.teacher_params else
               f"teacher: distill.teacher={cfg.distill.teacher} is not here: its weights are not counted\n"
               if plan.teacher_params is None else ""))


def _table(plans: dict[str, Plan]) -> str:
    """One row per component, one column per plan, in GiB per GPU."""
    rows = [("", *plans)]
    rows += [(label, *(_gib(getattr(p, name)) for p in plans.values())) for name, label in COMPONENTS.items()
             if name not in ("stream_memory", "teacher") or any(getattr(p, name) for p in plans.values())]
    # (a memory of streams and a teacher shown where there is one)
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
    capacity, largest = f"{plan.gpu_memory / GIB:g} GiB", f"largest micro batch that fits: {plan.max_micro_batch:,}"
    share = cfg.train.global_batch_size // plan.dp
    if plan.max_micro_batch > share:  # (a micro batch is at most a rank's share of the global batch)
        largest += (f" (more than the {share:,} samples a rank takes of train.global_batch_size="
                    f"{cfg.train.global_batch_size:,}: its whole share fits in one micro-batch)")
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
    over the data-parallel ranks under ZeRO, written by data-parallel rank 0 alone without it (pretrain/checkpoint.py),
    and the memory of its streams where the model carries one (every data-parallel rank's TP rank 0 writes it: counted
    for each writer, an upper bound under TP)."""
    per_shard = CHECKPOINT_BYTES * plan.params_per_rank
    if cfg.zero.stage:
        return per_shard / plan.dp + plan.stream_memory, plan.tp * plan.dp
    return per_shard + plan.stream_memory, plan.tp * (plan.dp if plan.stream_memory else 1)


def _checkpoint_time(cfg: Config, plan: Plan, gpus_per_node: int, write_gbps: float) -> str:
    """The checkpoint a node writes, its time at `write_gbps` (plus hashing at SHA256_GBPS per process), and the
    --signal lead time that leaves room for it and a step."""
    per_process, writers = checkpoint_bytes(cfg, plan)
    per_node = per_process * min(gpus_per_node, writers)
    seconds = per_node / (write_gbps * 1e9) + per_process / (SHA256_GBPS * 1e9)
    lead = max(120, math.ceil((2 * seconds + 60) / 30) * 30)
    return (f"\ncheckpoint: {_gib(per_process * writers)} GiB in all, up to {_gib(per_node)} GiB per node of "
            f"{gpus_per_node} GPUs: about {seconds:.0f} s at {write_gbps:g} GB/s per node; ask Slurm for the warning "
            f"at least that plus one step before the time limit: sbatch --signal=B:USR1@{lead} (slurm/pretrain.sbatch)")


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


REASONS = {  # why a layout's part is bigger than the fastest layout's (the layout, the fastest)
    "compute (matmuls)": lambda c, best: "recomputes activations" if c.model.activation_checkpointing else
    f"micro batch {c.train.micro_batch_size}: smaller matmuls" if c.train.micro_batch_size < best.train.micro_batch_size
    else "",
    "memory-bound kernels": lambda c, best: f"kernels={c.kernels_on(cuda=True)}, micro batch {c.train.micro_batch_size}",
    "tensor-parallel all-reduces": lambda c, best: f"tp {c.parallel.tp}: 4 all-reduces per layer per micro batch",
    "data-parallel / ZeRO communication": lambda c, best: (
        "gradient all-reduce each step", "gradient all-reduce and weight all-gather each step",
        "gradient all-reduce every micro batch", "weights gathered every micro batch")[c.zero.stage],
    "optimizer step": lambda c, best: "every rank updates its whole TP shard" if c.zero.stage == 0 else "",
}


def _relayout(counted, cfg: Config, variant: Config):
    """Launches counted for `cfg`, moved to another layout of it by what the estimate says the layout changes (a
    recomputed forward: more); None when not counted."""
    if counted is None:
        return None
    now, then = estimate_launches(variant), estimate_launches(cfg)
    return Launches(*(getattr(counted, f.name) + getattr(now, f.name) - getattr(then, f.name)
                      for f in dataclasses.fields(Launches)))


def ranking(cfg: Config, hw: hardware.Hardware, world: int, eff: hardware.Efficiency, memory_gib: float | None,
            launches=None, top: int = 12) -> str:
    """`ptm plan --gpu --compare`: the layouts that fit (tp within a node, ZeRO stage, micro batch, activation
    checkpointing), fastest first, each with the part that makes it slower than the fastest. `launches`: the
    step's kernel launches as counted (pretrain/launches.py; default: estimated per layout)."""
    found, unfit = [], 0
    micro = {2 ** i for i in range(12)} | {cfg.train.micro_batch_size}
    for tp in (t for t in (1, 2, 4, 8) if t <= hw.gpus_per_node and world % t == 0):
        for stage in range(4):
            for ckpt in (False, True):
                for b in sorted(micro):
                    v = _variant(cfg, {"parallel.tp": tp, "zero.stage": stage, "train.micro_batch_size": b,
                                       "model.activation_checkpointing": ckpt,
                                       "zero.offload": cfg.zero.offload and stage > 0})
                    try:
                        plan = estimate(v, world, memory_gib)
                        p = speed.predict(v, hw, world, eff, launches=_relayout(launches, cfg, v))
                    except ConfigError:  # tp does not divide the heads, the batch does not split, ...
                        continue
                    if plan.fits is False:
                        unfit += 1
                    else:
                        found.append((p.step, v, plan, p))
    if not found:
        return f"no layout of {world} GPUs fits in {memory_gib:g} GiB per GPU ({unfit} tried)"
    found.sort(key=lambda item: (item[0], item[2].total))
    first = found[0][3]
    best = first.parts()
    lines = [f"layouts on {speed.hardware_line(hw, world, eff)}, fastest first ({len(found)} fit"
             + (f", {unfit} do not fit in {memory_gib:g} GiB" if memory_gib else "") + "):",
             f"  {'#':>3} {'tp':>3} {'ZeRO':>4} {'micro':>6} {'ckpt':>5} {'GiB/GPU':>8} {'step':>12} {'samples/s':>11} "
             f"{'MFU':>6}  slower than #1 because"]
    for rank, (_, v, plan, p) in enumerate(found[:top], 1):
        if rank == 1:
            why = "fastest"
        elif p.step <= found[0][0] * (1 + 1e-9):
            why = "as fast"
        elif p.host > p.device:  # the host's launches bound this step, not a part of the device's time
            why = f"+{speed.ms(p.step - first.step)} host-bound ({p.launches:,} kernel launches, #1 {first.launches:,})"
        else:  # the step's difference, named by the device part that grew most
            part = max(p.parts(), key=lambda k: p.parts()[k] - best[k])
            hint = REASONS[part](v, found[0][1])
            why = f"+{speed.ms(p.step - first.step)} {part}" + (f" ({hint})" if hint else "")
        lines.append(f"  {rank:>3} {v.parallel.tp:>3} {v.zero.stage:>4} {v.train.micro_batch_size:>6} "
                     f"{'yes' if v.model.activation_checkpointing else 'no':>5} {plan.total / 2 ** 30:>8.2f} "
                     f"{speed.ms(p.step):>12} {p.samples_per_s:>11,.1f} {100 * p.mfu:>5.1f}%  {why}")
    if len(found) > top:
        lines.append(f"  ... {len(found) - top} slower layouts not shown")
    return "\n".join(lines)



if __name__ == "__main__":
    main()
