"""Run under torchrun by bench/gpu_smoke.py: train its paths one after another in one process group (no start-up
cost per path), each into OUT/PATH, and append what happened to RESULTS, one JSON object a line.

    torchrun --nproc_per_node N bench/smoke_worker.py RESULTS OUT '{"PATH": ["CONFIG", "key=value", ...], ...}'

Rank 0 appends {"path", "started"} when a path starts and {"path", "ok": true, "step_time_s", "mfu", "memory_gib",
"device_memory_gib", "kernels", "seconds"} when it ends (step time and MFU: medians over the steps after the first;
memory: the peak over its steps as metrics.jsonl logs it, GPU memory allocated by torch since the path started, on a
CPU the process's peak resident size so far; seconds: the path's wall time, start-up and compilation included). A
rank whose path raises appends {"path", "ok": false, "error": LINE} and the process exits 3 (torchrun stops the
others), so that the runner relaunches a fresh process group for the paths left instead of training them beside a
half-built engine or after a failed collective.

Test hook: GPU_SMOKE_ABORT=PATH@N makes every rank of an N-process launch abort (SIGABRT, as NCCL's watchdog does)
when PATH starts.
"""
from __future__ import annotations

import faulthandler
import gc
import json
import os
import shutil
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist

from pretrain.config import load
from pretrain.parallel import mcore
from pretrain.train import Trainer


def append(results: str, row: dict) -> None:
    with open(results, "a") as f:
        f.write(json.dumps(row) + "\n")


def one_line(e: BaseException) -> str:
    """The exception's type and the first line of its message."""
    first = next((line for line in str(e).splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {first.strip()}"[:300]


def measured(run_dir: str, trainer: Trainer) -> dict:
    """Step time, MFU and memory from rank 0's metrics.jsonl, and the kernels that ran."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    timed = rows[1:] or rows

    def median(key):
        values = [r[key] for r in timed if key in r]
        return statistics.median(values) if values else None
    run = trainer.parallel
    return {"step_time_s": median("step_time_s"), "mfu": median("mfu"),
            "memory_gib": max(r["memory_gib"] for r in rows),
            "device_memory_gib": max((r["device_memory_gib"] for r in rows if "device_memory_gib" in r), default=None),
            "kernels": run.kernels + (" + fused loss" if run.fused_lm_loss else "")}


def abort_if_asked(name: str) -> None:
    """The test hook: GPU_SMOKE_ABORT=PATH@N aborts every rank of an N-process launch as PATH starts, saying why as
    C++ does before an abort."""
    hook = os.environ.get("GPU_SMOKE_ABORT")
    if hook == f"{name}@{os.environ.get('WORLD_SIZE', '1')}":
        if dist.is_initialized():
            dist.barrier()  # rank 0 has recorded the path's start: no rank dies before it can
        print("terminate called after throwing an instance of 'c10::DistBackendError'\n"
              f"  what():  GPU_SMOKE_ABORT={hook}: a simulated abort", file=sys.stderr, flush=True)
        os.abort()


def train(results: str, name: str, run_dir: str, overrides: list) -> None:
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if rank0:
        append(results, {"path": name, "started": True})
    abort_if_asked(name)
    start = time.time()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(load(overrides[0], [*overrides[1:], f"out_dir={run_dir}"]))
    try:
        trainer.fit()
        row = measured(run_dir, trainer) if rank0 else None
    finally:
        trainer.close()
    dist.barrier()
    if rank0:
        append(results, {"path": name, "ok": True, **row, "seconds": time.time() - start})
        shutil.rmtree(os.path.join(run_dir, "checkpoints"), ignore_errors=True)  # BERT-base's: 1.3 GB per path
    gc.collect()


def main() -> None:
    faulthandler.enable(all_threads=True)  # a rank that aborts shows where its threads were
    if len(sys.argv) != 4:
        sys.exit("usage: torchrun --nproc_per_node N bench/smoke_worker.py RESULTS OUT PATHS_JSON "
                 "(bench/gpu_smoke.py runs it)")
    results, out, paths = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    try:
        for name, overrides in paths.items():
            try:
                train(results, name, os.path.join(out, name), overrides)
            except Exception as e:  # noqa: BLE001 - the path's one line goes to the table; a fresh launch goes on
                traceback.print_exc()
                append(results, {"path": name, "ok": False, "error": one_line(e)})
                sys.stderr.flush()
                os._exit(3)  # not through the interpreter's exit: a rank stuck in a collective must not hold it
    finally:
        mcore.shutdown()


if __name__ == "__main__":
    main()
