"""`ptm plan`'s host term against ptm's own runs measured on a GPU (bench/ptm_runs.yaml): each run's launches
counted on this machine (pretrain/launches.py: its config narrowed, a few real steps), the step predicted on the
run's GPU as the longer of the device's time and the host's (launches x the generation's launch_us), next to the
measured step. One row is the calibration of launch_us (printed: the value it fits); the others are held out.

    python bench/host_model.py DATA [DATA_T5] [--counts FILE]
DATA: a ptm dataset (any vocabulary: the counts do not depend on it; the step is predicted at the runs' own,
--vocab); DATA_T5: one with T5's sentinels, for the t5 row; --counts: a JSON file keeping the counts (read for the
rows it has, written with the others).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from data_prep import PrepError  # noqa: E402
from pretrain import hardware, launches, speed  # noqa: E402
from pretrain.config import ConfigError, load  # noqa: E402
from pretrain.cost import Launches  # noqa: E402
from pretrain.models import layers  # noqa: E402

RUNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ptm_runs.yaml")
GOAL = 0.20  # issue 39: within 20% on each measured row


@contextlib.contextmanager
def code(name: str | None):
    """Count as the run's code launched: before-tp1, megatron-core's linear layers at TP=1 too."""
    if name != "before-tp1":
        yield
        return
    one_rank = layers._OneRankFast._one_rank
    layers._OneRankFast._one_rank = lambda self: False
    try:
        yield
    finally:
        layers._OneRankFast._one_rank = one_rank


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", metavar="DATA", help="a ptm dataset (any vocabulary)")
    ap.add_argument("data_t5", nargs="?", metavar="DATA_T5", help="one with T5's sentinels (without it: no t5 row)")
    ap.add_argument("--vocab", type=int, default=30522, help="the runs' vocabulary (T5's: this + its 100 sentinels)")
    ap.add_argument("--counts", help="a JSON file of counts, read and written")
    args = ap.parse_args()
    known = json.load(open(args.counts)) if args.counts and os.path.isfile(args.counts) else {}
    with open(RUNS) as f:
        spec = yaml.safe_load(f)
    hw = hardware.gpu(spec["gpu"], gpus_per_node=1)
    rows = []
    for run in spec["runs"]:
        data = args.data_t5 if run.get("data") == "t5" else args.data
        if data is None:
            print(f"{run['config']}: skipped (give DATA_T5)", file=sys.stderr)
            continue
        cfg = load(run["config"], [f"data.path={data}", "model.vocab_size=0", *spec["common"], *run.get("set", [])])
        key = json.dumps([run["config"], run.get("set", []), run.get("code")])
        try:
            if key not in known:
                with code(run.get("code")):
                    known[key] = dataclasses.asdict(launches.count(cfg)[0])
        except ConfigError as e:
            print(f"{run['config']}: not counted: {e}", file=sys.stderr)
            continue
        if args.counts:
            with open(args.counts, "w") as f:
                json.dump(known, f, indent=1)
        counted = Launches(**known[key])
        cfg.model.vocab_size = args.vocab + (100 if run.get("data") == "t5" else 0)
        rows.append((run, cfg, counted))
        print(f"{run['config']}: {counted}", file=sys.stderr, flush=True)
    calibration = next((r for r in rows if r[0].get("calibration")), None)
    if calibration:
        run, cfg, counted = calibration
        p = speed.predict(cfg, hw, 1, launches=counted)
        hw = dataclasses.replace(hw, launch_us=run["step_ms"] * 1e3 / p.launches)
        print(f"launch_us fitted to {run['config']}: {hw.launch_us:.1f}\n")
    print("| run | launches | device ms | host ms | predicted ms | measured ms | measured/predicted | "
          f"within {GOAL:.0%} |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    misses = []
    for run, cfg, counted in rows:
        p = speed.predict(cfg, hw, 1, launches=counted)
        ratio = run["step_ms"] / (1e3 * p.step)
        held = "calibration" if run.get("calibration") else "yes" if abs(ratio - 1) <= GOAL else "no"
        misses += [run["config"]] if held == "no" else []
        print(f"| {run['config']} | {p.launches:,} | {1e3 * p.device:.1f} | {1e3 * p.host:.1f} | {1e3 * p.step:.1f} | "
              f"{run['step_ms']:.1f} | {ratio:.3f} | {held} |")
    print(f"\n{len(rows) - 1 - len(misses)} of {len(rows) - 1} held-out rows within {GOAL:.0%}"
          + (f"; outside: {', '.join(misses)}" if misses else ""))


if __name__ == "__main__":
    try:
        main()
    except PrepError as e:  # DATA or DATA_T5 is not a dataset these runs train on
        sys.exit(f"host_model.py: {e}")
