"""Helpers for tests that train: launch tests/engine_worker.py under torchrun, kill a run, compare checkpoints."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import torch

from conftest import ROOT, free_port
from pretrain import checkpoint as C


def worker(out, runs: dict, nproc: int) -> list[str]:
    """The torchrun command line of tests/engine_worker.py training `runs` into `out`."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
            os.path.join(ROOT, "tests", "engine_worker.py"), str(out), json.dumps(runs)]


def launch(out, runs: dict, nproc: int = 4, timeout: int = 1200):
    proc = subprocess.run(worker(out, runs, nproc), cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise AssertionError(f"exit {proc.returncode}\n{_errors(proc.stderr)}")
    return proc


def _errors(stderr: str) -> str:
    """The end of a failed launch's stderr without the warnings."""
    return "\n".join(line for line in stderr.splitlines() if "arning" not in line)[-12000:]


def start(out, runs: dict, nproc: int):
    return subprocess.Popen(worker(out, runs, nproc), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def kill_when(proc, ready, timeout=300):
    """SIGKILL the launcher and every process under it (torchrun starts its workers in sessions of their own) as
    soon as ready() is true; fails if the run ended first."""
    import psutil

    deadline = time.time() + timeout
    while not ready():
        assert proc.poll() is None, f"the run ended before it could be killed:\n{_errors(proc.stderr.read())}"
        assert time.time() < deadline
        time.sleep(0.002)
    tree = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    for child in tree:
        try:
            child.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    psutil.wait_procs(tree, timeout=30)


def config(run: list):
    from pretrain.config import load

    return load(run[0], run[1:])


def weights(run_dir) -> dict:
    return C.load_full_model(C.resolve(str(run_dir)))


def facts(run_dir) -> dict:
    """What tests/engine_worker.py recorded about a run (optimizer wrapper, step counts, loss scale)."""
    return json.load(open(os.path.join(run_dir, "facts.json")))


def without_key_bias(state: dict, heads: int | dict[str, int]) -> dict:
    """The key bias has a zero gradient in exact arithmetic (softmax ignores a shift shared by a row of scores), so
    Adam-type optimizers turn its float noise into steps of lr * noise / eps that differ between any two
    summation orders. It is left out of the comparisons (per-head [q, k, v] layout). `heads`: the attention heads, or
    {parameter name prefix: heads} for models of several widths (ELECTRA's generator: {"": 4, "generator.": 2})."""
    out, per_prefix = dict(state), heads if isinstance(heads, dict) else {"": heads}
    for k, v in state.items():
        if k.endswith("attn.qkv.bias"):
            n = per_prefix[max((p for p in per_prefix if k.startswith(p)), key=len)]
            out[k] = v.view(n, 3, -1)[:, [0, 2]].reshape(-1)
    return out


def rel_diffs(a: dict, b: dict, heads: int | dict[str, int]) -> dict[str, float]:
    """Per tensor ||a - b|| / ||b||, key biases left out."""
    assert a.keys() == b.keys()
    a, b = without_key_bias(a, heads), without_key_bias(b, heads)
    return {k: ((a[k] - b[k]).norm() / b[k].norm().clamp(min=1e-12)).item() for k in a}


def max_rel_diff(a: dict, b: dict, heads: int | dict[str, int] = 4) -> float:
    """The largest per-tensor relative difference ||a - b|| / ||b||."""
    return max(rel_diffs(a, b, heads).values())


def losses_by_step(run_dir, key: str = "mlm_loss") -> dict:
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    return {r["step"]: r[key] for r in rows}  # a resumed run's rows for a step replace the killed run's


def assert_same_checkpoints(a, b):
    """Weights and both moments bit for bit, at the same step."""
    pa, pb = C.Pieces(C.resolve(str(a))), C.Pieces(C.resolve(str(b)))
    assert pa.meta["step"] == pb.meta["step"]
    for kind in C.KINDS:
        odd = [n for n in pa.params if not torch.equal(pa.full(kind, n), pb.full(kind, n))]
        assert not odd, (kind, odd[:3])


def latest_step(run_dir) -> int:
    try:
        return int(open(os.path.join(run_dir, "checkpoints", "latest")).read().strip().split("_")[1])
    except (OSError, IndexError, ValueError):
        return -1


def summary(run_dir) -> dict:
    return json.load(open(os.path.join(run_dir, "summary.json")))
