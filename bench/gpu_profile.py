"""Where ptm's training step spends its time on one GPU: per variant (compiled or eager blocks, LAMB or AdamW, the
fused LM loss on or off), the step's wall time next to the time the GPU was busy, kernel launches and host syncs
per step, the kernels that took the most device time and the host-side ops that took the most CPU time, and what
dynamo compiled (frames, graph breaks, recompilations) during the timed steps.

    python bench/gpu_profile.py [--case bert-large-128] [--precision bf16] [--steps 4] [--tiny]

A step whose wall time is far above its GPU-busy time is bound by the host (Python, launches, syncs); one whose
busy time is far above `ptm plan`'s prediction is bound by kernels the model does not count.
"""
from __future__ import annotations

import argparse
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from gpu_step import CASES, config, device
from step_runs import _sync, ptm_step, seconds

VARIANTS = {  # name: (kernels, optimizer, fused LM loss)
    "compile lamb": ("compile", "lamb", False),
    "eager lamb": ("eager", "lamb", False),
    "eager adamw": ("eager", "adamw", False),
    "eager lamb fused": ("eager", "lamb", True),
}
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def table(rows, n: int, key, label: str, steps: int) -> list[str]:
    rows = sorted(rows, key=key, reverse=True)[:n]
    return [f"    {key(r) / steps / 1e3:>8.2f} ms {r.count // steps:>6}x  {r.key[:90]}" for r in rows] or \
        [f"    ({label}: none)"]


def one(case: str, precision: str, variant: str, steps: int, tiny: bool, device) -> list[str]:
    import torch._dynamo.utils as du

    kernels, opt, fused = VARIANTS[variant]
    cfg, batch = config(case, precision, tiny, kernels)
    cfg.optimizer.name = opt
    step = ptm_step(cfg, batch, fused=fused)
    wall = seconds(step, steps, device)
    before = Counter({k: sum(v.values()) for k, v in du.counters.items()})
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        _sync(device)
    compiled = Counter({k: sum(v.values()) for k, v in du.counters.items()}) - before
    return summary(variant, prof, steps, wall, compiled)


def summary(name: str, prof, steps: int, wall: float, compiled) -> list[str]:
    """A profile of `steps` steps as lines: wall time, GPU busy time, launches and syncs per step, dynamo's work,
    the kernels by device time and the host ops by self CPU time."""
    events = prof.key_averages()
    ranges = {e.name for e in prof.events() if e.is_user_annotation}  # e.g. the optimizer step's: not kernels
    dev = [e for e in events if e.device_type.name == "CUDA" and e.self_device_time_total > 0 and e.key not in ranges]
    busy = sum(e.self_device_time_total for e in dev) / steps / 1e3
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                                                         "cudaLaunchKernelExC")) / steps
    syncs = {e.key: e.count // steps for e in events if e.key.startswith(SYNCS)}
    lines = [f"  {name}: step {1e3 * wall:.1f} ms (median of {steps}), GPU busy {busy:.1f} ms, "
             f"{launches:.0f} launches, syncs {syncs or 'none'}, "
             f"dynamo during the profile {dict(compiled) or 'nothing'}",
             "   kernels by device time per step:"]
    lines += table(dev, 12, lambda e: e.self_device_time_total, "kernels", steps)
    lines.append("   host ops by self CPU time per step:")
    host = [e for e in events if e.device_type.name == "CPU"]
    lines += table(host, 12, lambda e: e.self_cpu_time_total, "ops", steps)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="bert-large-128", choices=list(CASES), metavar="CASE",
                    help=f"one of bench/gpu_step.py's: {', '.join(CASES)} (default: %(default)s)")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp16", "fp32"], help="(default: %(default)s)")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS), metavar="VARIANT",
                    help=f"blocks, optimizer and LM loss to profile (default: all of {', '.join(VARIANTS)})")
    ap.add_argument("--steps", type=int, default=4, help="steps timed, then profiled (default: %(default)s)")
    ap.add_argument("--tiny", action="store_true", help="2-layer model: check the script on a CPU")
    args = ap.parse_args()
    dev = device(args.tiny, "gpu_profile.py")
    print(f"{torch.cuda.get_device_name() if dev.type == 'cuda' else 'CPU'}, torch {torch.__version__}; "
          f"{args.case} {args.precision}", flush=True)
    for variant in args.variants:
        try:
            print("\n".join(one(args.case, args.precision, variant, args.steps, args.tiny, dev)), flush=True)
        except Exception as e:  # noqa: BLE001 - a variant that cannot run says why; the others go on
            print(f"  {variant}: could not run: {type(e).__name__}: {str(e).splitlines()[0][:150]}", flush=True)


if __name__ == "__main__":
    main()
