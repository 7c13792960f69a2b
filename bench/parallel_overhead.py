"""Step-time overhead of tensor parallelism and of each ZeRO stage, side by side with TP=1 / ZeRO-0 on the same
number of processes, measured by training the same tiny BERT with `torchrun -m pretrain train`.

    python bench/parallel_overhead.py [--nproc 2] [--steps 30] [--config bert-tiny] [--set KEY=VALUE ...]

Prints the median step time of each layout (first 3 steps left out) and its ratio to the TP=1 / ZeRO-0
baseline. On a CPU box the numbers are communication/bookkeeping overhead on gloo, not GPU speed. Every run starts
afresh: a run an earlier call left in --work is removed, not resumed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULTS = ["train.global_batch_size=16", "train.micro_batch_size=4", "optimizer.warmup_steps=2"]


def dataset(work: str) -> str:
    """The embedded default corpus, built once into `work`."""
    out = os.path.join(work, "data")
    if not os.path.isfile(os.path.join(out, "manifest.json")):
        subprocess.run([sys.executable, "-m", "data_prep", "corpus", "--out", os.path.join(work, "corpus")], check=True,
                       cwd=ROOT, capture_output=True)
        subprocess.run([sys.executable, "-m", "data_prep", "build", os.path.join(work, "corpus"), "--out", out,
                        "--vocab-size", "8000"], check=True, cwd=ROOT, capture_output=True)
    return out


def step_seconds(args, name: str, overrides: list[str], work: str, data: str) -> float:
    out = os.path.join(work, name)
    shutil.rmtree(out, ignore_errors=True)  # an earlier call's run would resume at its end and train nothing
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.nproc}", "-m", "pretrain", "train",
           "--config", args.config, "--set", f"data.path={data}", f"out_dir={out}", f"train.steps={args.steps}",
           "train.eval_interval=0", "checkpoint.interval=0", "data.num_workers=1", *args.overrides, *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return statistics.median(r["step_time_s"] for r in rows[3:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2, help="processes per run (TP x DP); 2 on a 2-core box")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per run (at least 4)")
    ap.add_argument("--config", default="bert-tiny", help="config preset or YAML file")
    ap.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="KEY=VALUE",
                    help="extra config overrides for every run, after " + " ".join(DEFAULTS))
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "ptm-bench-parallel"),
                    help="scratch directory (dataset and runs)")
    args = ap.parse_args()
    if args.steps < 4:
        sys.exit(f"parallel_overhead.py: --steps {args.steps}: the first 3 steps are left out of the median; "
                 "give 4 or more")
    args.overrides = [*DEFAULTS, *args.overrides]
    data = dataset(args.work)
    layouts = {"tp1 zero0 (baseline)": ["parallel.tp=1", "zero.stage=0"],
               f"tp{args.nproc} zero0": [f"parallel.tp={args.nproc}", "zero.stage=0"]}
    layouts.update({f"tp1 zero{z}": ["parallel.tp=1", f"zero.stage={z}"] for z in (1, 2, 3)})
    print(f"{args.config}, {args.nproc} processes, {args.steps} steps, {' '.join(args.overrides)}")
    print(f"{'layout':<22} {'step time':>10} {'vs baseline':>12}")
    base = None
    for name, overrides in layouts.items():
        t = step_seconds(args, name.split()[0] + name.split()[1], overrides, args.work, data)
        base = base or t
        print(f"{name:<22} {t * 1e3:>8.2f}ms {t / base:>11.2f}x", flush=True)


if __name__ == "__main__":
    main()
