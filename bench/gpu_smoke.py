"""The first day on a GPU machine in one command: train every path that only a GPU runs for a few steps, on one GPU
and on all local GPUs, and print one table: path, processes, step time (the median after the first step), MFU, peak
memory (torch's on the GPU, and all the device has in use; on a CPU the process's peak resident size so far), wall
time, the kernels that ran, and ok or the path's error line. Exit status 0 when every path is ok, else 1.

    python bench/gpu_smoke.py [--out DIR] [--data DIR] [--tiny] [--paths PATH ...] [--configs PRESET ...]
                              [--set [PATH:]KEY=VALUE ...]

Paths: fp32/bf16/fp16 x ZeRO 0-3 with the defaults a user gets (`kernels=auto`, `fused_lm_loss=auto`: eager
blocks and the fused LM loss on a GPU; bf16 at ZeRO-0 accumulates in bf16, DeepSpeed's only choice
there), ZeRO-Offload at stages 2 and 3, the fused LM loss on and off, `kernels=compile`, `data.unpadded=true`.
Per process count, ONE torchrun launch of bench/smoke_worker.py trains the paths one after another; a path that
raises is recorded with its error line and the launch ends; a launch that dies (an NCCL abort, a killed process)
marks the path it was running as failed with the last error line of the ranks' stderr; a path that runs past
--timeout is stopped; either way a new launch goes on with the paths left. Logs: OUT/logs; runs: OUT/runs (what an
earlier call left there for the same runs is removed first).

`--configs` trains the paths once per model config (every family's preset, say), each run named CONFIG.PATH; a
`--set` prefix names a path, a config or one such run.

The dataset is built once from the embedded corpus into OUT/data (or --data: a dataset of your own). Defaults: a
BERT-base at seq 128, micro batch 32, 2 micro-batches per step, 10 steps; `--tiny` (a CPU: tests/test_bench.py)
trains bert-tiny for 2 steps of one micro-batch of 2 on the corpus's English documents (500 pieces: under Triton's
interpreter the fused loss costs time per vocabulary row) and counts 2 processes as "all local GPUs".
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "bench", "smoke_worker.py")
PATHS: dict[str, list[str]] = {
    **{f"{p}-zero{z}": [f"precision={p}", f"zero.stage={z}"] for p in ("fp32", "bf16", "fp16") for z in range(4)},
    **{f"offload-zero{z}": ["precision=bf16", f"zero.stage={z}", "zero.offload=true"] for z in (2, 3)},
    "fused-loss-on": ["precision=bf16", "zero.stage=1", "kernels=eager", "fused_lm_loss=on"],
    "fused-loss-off": ["precision=bf16", "zero.stage=1", "kernels=eager", "fused_lm_loss=off"],
    "compile": ["precision=bf16", "zero.stage=1", "kernels=compile", "fused_lm_loss=off"],
    "unpadded": ["precision=bf16", "zero.stage=1", "data.unpadded=true"],
}
PATHS["bf16-zero0"].append("grad_accum_dtype=bf16")  # DeepSpeed's only choice at ZeRO-0
SIZES = {  # the defaults of a GPU and of --tiny (a CPU); "corpus": what of the embedded corpus the dataset holds
    False: {"config": "bert-base", "seq_len": 128, "micro_batch": 32, "accumulation": 2, "steps": 10, "vocab": 30522,
            "corpus": ""},
    True: {"config": "bert-tiny", "seq_len": 64, "micro_batch": 2, "accumulation": 1, "steps": 2, "vocab": 500,
           "corpus": "en.jsonl"}}
ERROR = re.compile(r"\w+(Error|Exception)\b|what\(\):|out of memory|Killed|Aborted|Segmentation fault")


def dataset(out: str, vocab: int, part: str) -> str:
    """The embedded corpus (or its file `part`) built into OUT/data once (data_prep, as scripts/demo.sh does)."""
    data = os.path.join(out, "data")
    if not os.path.isfile(os.path.join(data, "manifest.json")):
        print(f"building the dataset in {data} from the embedded corpus", flush=True)
        corpus = os.path.join(out, "corpus")
        build = ["build", os.path.join(corpus, part), "--out", data, "--vocab-size", str(vocab), "--workers", "2",
                 "--overwrite", "--no-progress"]
        for args in (["corpus", "--out", corpus], build):
            subprocess.run([sys.executable, "-m", "data_prep", *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return data


def plan(args) -> dict[str, tuple[str, str]]:
    """{run name: (config, path)}: the paths, or with --configs each config's paths named CONFIG.PATH."""
    if not args.configs:
        return {path: (args.config, path) for path in args.paths}
    return {f"{short(config)}.{path}": (config, path) for config in args.configs for path in args.paths}


def short(config: str) -> str:
    """A config's name in run names: a preset as it is, a YAML file by its stem."""
    return os.path.splitext(os.path.basename(config))[0]


def per_path(items: list[str], known) -> dict[str, list[str]]:
    """--set items as {prefix: overrides}: KEY=VALUE for every run ("" key), PREFIX:KEY=VALUE for the runs of one
    path, one config or one run (`known`: the prefixes there are)."""
    out: dict[str, list[str]] = {"": []}
    for item in items:
        key, _, value = item.partition("=")
        path, colon, key = key.rpartition(":") if ":" in key else ("", "", key)
        if colon and path not in known:
            sys.exit(f"gpu_smoke: --set {item}: there is no path, config or run {path!r}; these are: "
                     f"{', '.join(sorted(known))}")
        out.setdefault(path, []).append(f"{key}={value}")
    return out


def prefixes(runs: dict[str, tuple[str, str]]) -> set[str]:
    return {p for name, (config, path) in runs.items() for p in (name, short(config), path)}


def runs(args, nproc: int, data: str, names: list[str]) -> dict[str, list[str]]:
    """{run: [config, overrides...]} for the worker on `nproc` processes."""
    extra = per_path(args.overrides, prefixes(args.runs))
    common = [f"data.path={data}", "model.vocab_size=0", f"data.seq_len={args.seq_len}",
              f"train.micro_batch_size={args.micro_batch}",
              f"train.global_batch_size={args.micro_batch * args.accumulation * nproc}", f"train.steps={args.steps}",
              "optimizer.warmup_steps=0", "train.eval_interval=0", "train.eval_steps=1",
              "checkpoint.interval=0", "checkpoint.keep=1", "data.num_workers=1"]
    out = {}
    for name in names:
        config, path = args.runs[name]
        out[name] = [config, *common, *PATHS[path], *extra[""], *extra.get(short(config), []),
                     *extra.get(path, []), *(extra.get(name, []) if name != path else [])]
    return out


def error_line(paths: list[str]) -> str | None:
    """The last error-looking line of these logs (Python's own `Fatal Python error` only when nothing else is)."""
    lines = []
    for path in paths:
        with open(path, errors="replace") as f:
            lines += [line.strip() for line in f if ERROR.search(line) and "arning" not in line]
    told = [line for line in lines if not line.startswith("Fatal Python error")]
    return (told or lines or [None])[-1]


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to torchrun (it stops its workers), then SIGKILL to whatever of the launch is left."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        pass
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()


def read(results: str, seen: int) -> list[dict]:
    """The result rows past the first `seen` ones (whole lines only: a rank may be writing one)."""
    if not os.path.isfile(results):
        return []
    with open(results) as f:
        return [json.loads(line) for line in f.read().split("\n")[:-1][seen:]]


def launch(args, nproc: int, data: str, names: list[str], number: int, done: dict, report) -> None:
    """One torchrun launch training `names` in order; each path that ends (ok, failed, timed out, or was running
    when the launch died) goes into `done` and to `report`."""
    tag = f"n{nproc}-launch{number}"
    logs, results = os.path.join(args.out, "logs", tag), os.path.join(args.out, "logs", f"{tag}.jsonl")
    for old in [logs, *(os.path.join(args.out, "runs", f"n{nproc}", name) for name in names)]:  # an earlier call's:
        shutil.rmtree(old, ignore_errors=True)  # its rows would be read as this launch's, its runs appended to
    if os.path.exists(results):
        os.remove(results)
    os.makedirs(logs, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
           f"--log-dir={logs}", "--redirects=3", WORKER, results, os.path.join(args.out, "runs", f"n{nproc}"),
           json.dumps(runs(args, nproc, data, names))]
    with open(os.path.join(logs, "torchrun.log"), "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        running, timed_out = watch(proc, results, args.timeout, nproc, done, report)
    except BaseException:  # Ctrl-C: the launch runs in a session of its own and would go on without us
        stop(proc)
        raise

    def why() -> str:
        if timed_out:
            return f"timed out after {args.timeout} s (raise --timeout if it was still making progress)"
        return (error_line(sorted(glob.glob(os.path.join(logs, "**", "stderr.log"), recursive=True)))
                or error_line([os.path.join(logs, "torchrun.log")]) or f"the launch exited {proc.returncode}")
    if running and running not in done:
        done[running] = {"path": running, "ok": False, "error": why()}
        report(nproc, done[running])
    elif not any(row.get("started") for row in read(results, 0)):  # nothing started: a relaunch would not either
        for name in names:
            done[name] = {"path": name, "ok": False, "error": f"not run: {why()} (see {logs})"}
            report(nproc, done[name])


def watch(proc: subprocess.Popen, results: str, timeout: int, nproc: int, done: dict, report):
    """Follow a launch's results until it exits, or until `timeout` seconds pass without a new row (then stop it);
    returns the path that was running (None between paths) and whether it timed out."""
    running, since, seen = None, time.time(), 0
    while True:
        exited = proc.poll() is not None
        for row in read(results, seen):
            seen, since = seen + 1, time.time()
            if "started" in row:
                running = row["path"]
            elif row["path"] not in done:
                running = None if row["path"] == running else running
                done[row["path"]] = row
                report(nproc, row)
        if exited:
            return running, False
        if time.time() - since > timeout:
            stop(proc)
            return running, True
        time.sleep(0.5)


def cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def row_text(nproc: int, row: dict) -> str:
    return (f"{row['path']:<{WIDTH}}{nproc:>6}{cell(row.get('step_time_s') and 1e3 * row['step_time_s'], '.1f'):>10}"
            f"{cell(row.get('mfu') and 100 * row['mfu'], '.1f'):>7}{cell(row.get('memory_gib'), '.2f'):>10}"
            f"{cell(row.get('device_memory_gib'), '.2f'):>11}{cell(row.get('seconds'), '.1f'):>8}  "
            f"{row.get('kernels', '-'):<22}{'ok' if row['ok'] else row['error']}")


WIDTH = 16  # the run names' column: wider for longer names (--configs)


def header() -> str:
    return (f"{'path':<{WIDTH}}{'procs':>6}{'step ms':>10}{'MFU %':>7}{'peak GiB':>10}{'device GiB':>11}"
            f"{'wall s':>8}  {'kernels':<22}result")


def main() -> int:
    import torch

    gpus = torch.cuda.device_count()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/gpu-smoke", help="dataset, runs and logs go here (default: %(default)s)")
    ap.add_argument("--data", help="a dataset of your own, built by `ptm prep` (default: OUT/data, built from the "
                                   "embedded corpus)")
    ap.add_argument("--tiny", action="store_true", help="bert-tiny, 2 steps, micro batch 2, 2 processes as 'all': "
                                                        "checks the script on a CPU")
    ap.add_argument("--config", help="the model's config preset or YAML (default: bert-base; --tiny: bert-tiny)")
    ap.add_argument("--seq-len", type=int, help="data.seq_len (default: 128; --tiny: 64)")
    ap.add_argument("--micro-batch", type=int, help="train.micro_batch_size (default: 32; --tiny: 2)")
    ap.add_argument("--accumulation", type=int, help="micro-batches per process and step (default: 2; --tiny: 1)")
    ap.add_argument("--steps", type=int, help="optimizer steps per path; the first is left out of the medians "
                                              "(default: 10; --tiny: 2)")
    ap.add_argument("--nproc", type=int, nargs="+", help="process counts to run every path on (default: 1 and all "
                                                         f"local GPUs, here {gpus or 2})")
    ap.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS), metavar="PATH",
                    help="paths to run (default: all): " + ", ".join(PATHS))
    ap.add_argument("--configs", nargs="+", metavar="CONFIG",
                    help="train the paths once per config preset or YAML, runs named CONFIG.PATH (default: --config)")
    ap.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="[PATH:]KEY=VALUE",
                    help="config overrides for every run, or with PREFIX: for one path's, one config's or one run's")
    ap.add_argument("--timeout", type=int, default=600, help="seconds a path (or a launch's start) may take before "
                                                             "the launch is stopped (default: %(default)s)")
    args = ap.parse_args()
    for key in ("config", "seq_len", "micro_batch", "accumulation", "steps"):
        if getattr(args, key) is None:
            setattr(args, key, SIZES[args.tiny][key])
    global WIDTH
    args.runs = plan(args)
    WIDTH = max(16, 2 + max(map(len, args.runs)))
    per_path(args.overrides, prefixes(args.runs))  # bad prefixes end here, before anything runs
    counts = args.nproc or sorted({1, gpus or 2})
    device = torch.cuda.get_device_name() if gpus else "CPU"
    print(f"{device} x {gpus}, torch {torch.__version__}; {' '.join(args.configs or [args.config])}, "
          f"seq {args.seq_len}, micro batch "
          f"{args.micro_batch} x {args.accumulation}, {args.steps} steps; processes {counts}", flush=True)
    data = args.data or dataset(args.out, SIZES[args.tiny]["vocab"], SIZES[args.tiny]["corpus"])
    rows: list[tuple[int, dict]] = []

    def report(nproc: int, row: dict) -> None:
        rows.append((nproc, row))
        print(row_text(nproc, row), flush=True)
    print(header(), flush=True)
    for nproc in counts:
        done: dict = {}
        number = 0
        while len(done) < len(args.runs):
            number += 1
            launch(args, nproc, data, [r for r in args.runs if r not in done], number, done, report)
    print(f"\n{sum(r['ok'] for _, r in rows)} of {len(rows)} paths ok (logs: {os.path.join(args.out, 'logs')})")
    print(header())
    for nproc, row in sorted(rows, key=lambda r: (r[0], list(args.runs).index(r[1]["path"]))):
        print(row_text(nproc, row))
    return 0 if all(r["ok"] for _, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
