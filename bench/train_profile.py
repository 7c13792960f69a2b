"""Where a real `ptm train` step spends its time, for any config (every family, its data, its memory): the trainer
runs WARMUP steps, then STEPS steps under torch's profiler, and prints what bench/gpu_profile.py prints for its
synthetic step (step wall time against GPU-busy time, launches and host syncs per step, the kernels by device time,
the host ops by CPU time). One process; on a CPU it checks itself (no kernels).

    python bench/train_profile.py CONFIG [--set KEY=VALUE ...] [--warmup 2] [--steps 3] [--out runs/train-profile]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from data_prep import PrepError  # noqa: E402
from gpu_profile import summary  # noqa: E402
from pretrain.config import ConfigError, load  # noqa: E402
from pretrain.train import Trainer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="a config preset or YAML")
    ap.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE", help="config overrides")
    ap.add_argument("--warmup", type=int, default=2, help="steps before the profile (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=3, help="steps profiled (default: %(default)s)")
    ap.add_argument("--out", default="runs/train-profile", help="the run's directory (default: %(default)s)")
    args = ap.parse_args()
    import torch._dynamo.utils as du

    cuda = torch.cuda.is_available()
    trainer = Trainer(load(args.config, ["optimizer.warmup_steps=0", *args.overrides,
                                         f"train.steps={args.warmup + args.steps}", "train.eval_interval=0",
                                         "checkpoint.interval=0", f"out_dir={args.out}"]))
    if trainer.run.resume:  # a run already there: it would go on from its checkpoint, past the steps to profile
        trainer.close()
        sys.exit(f"train_profile.py: --out {args.out} holds a run (it would resume from "
                 f"{os.path.basename(trainer.run.resume)}): remove it or give another --out")
    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
    inner, times, before = trainer.train_step, [], Counter()

    def step(batches):
        nonlocal before
        if trainer.step == args.warmup:
            before = Counter({k: sum(v.values()) for k, v in du.counters.items()})
            prof.start()
        start = time.perf_counter()
        out = inner(batches)
        if cuda:
            torch.cuda.synchronize()
        if trainer.step > args.warmup:
            times.append(time.perf_counter() - start)
        if trainer.step == args.warmup + args.steps:
            prof.stop()
        return out
    trainer.train_step = step
    try:
        trainer.fit()
    finally:
        trainer.close()
    compiled = Counter({k: sum(v.values()) for k, v in du.counters.items()}) - before
    device = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"{device}, torch {torch.__version__}; {args.config} {' '.join(args.overrides)}")
    print("\n".join(summary(os.path.basename(args.config), prof, args.steps, statistics.median(times), compiled)))


if __name__ == "__main__":
    try:
        main()
    except (ConfigError, PrepError) as e:  # a bad config or dataset: its one line
        sys.exit(f"train_profile.py: {e}")
