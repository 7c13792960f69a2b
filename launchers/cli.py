"""`python -m launchers` (also `ptm launch`): what the launcher told this process, a deepspeed hostfile from a
Slurm allocation, the prep -> train -> convert chain submitted to Slurm, and torchrun ending as its ranks agreed."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from launchers.rendezvous import (RendezvousError, describe, hostnames, job_port, node_address, tasks_per_node,
                                  uniform_tasks_per_node)
from ptm import shipped
from ptm.cli import show_defaults, whole


def parser() -> argparse.ArgumentParser:
    prog = sys.argv[0] if sys.argv[0].startswith("ptm ") else "python -m launchers"
    ap = argparse.ArgumentParser(prog=prog, description="One rendezvous contract for torchrun, the deepspeed launcher, "
                                                        "mpirun/mpiexec and srun; Slurm helpers.")
    ap.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)  # the deepspeed launcher adds it
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("env", help="print what this process's launcher says (run it the way you run training)",
                   description="Print, as JSON, the launcher detected from the environment and the rank, local "
                               "rank, world size, nodes and master address/port it gives; for debugging a "
                               "cluster: `srun python -m launchers env`, `mpirun ... python -m launchers env`.")
    h = sub.add_parser("hostfile", help="write a deepspeed hostfile from the current Slurm allocation",
                       description="Inside a Slurm job: one line `HOST slots=N` per allocated node, N from "
                                   "--slots, else the job's tasks per node (SLURM_TASKS_PER_NODE, the same on every "
                                   "node), else SLURM_GPUS_ON_NODE, else 1.")
    h.add_argument("--out", required=True, help="file to write (e.g. $SLURM_SUBMIT_DIR/hostfile)")
    h.add_argument("--slots", type=whole("a count (1, 2, ...)"),
                   help="processes per node (default: the job's tasks or GPUs per node)")
    sub.add_parser("master", help="print the master address and port of the current Slurm allocation",
                   description="`ADDR PORT`: the first node of SLURM_JOB_NODELIST (its Slurm NodeAddr when the name "
                               "does not resolve) and a port derived from the job id, what srun tasks compute too.")
    sub.add_parser("torchrun", help="torchrun ARGS... (its --help): a stop signal ends with the ranks' line and "
                                    "status (75, 130), not torchrun's traceback")  # (parsed by torchrun: `main`)
    c = sub.add_parser("slurm", help="submit prep -> train -> convert to Slurm, each job after the one before succeeds",
                       description="Submit the whole chain with --dependency=afterok and print the job ids: a "
                                   "tokenizer job (unless --tokenizer), the data_prep array (slurm/prep.sbatch, one "
                                   "partition per task) and its finalize job, training (slurm/pretrain.sbatch, which "
                                   "requeues itself on a time-limit warning) and the HF export (slurm/convert.sbatch). "
                                   "Site settings (PTM_PYTHON, modules) are read from the environment by the scripts. "
                                   "Logs: TOKENIZER-JOBID.out beside the trained tokenizer, DATA/slurm-prep-JOBID_TASK"
                                   ".out, DATA/slurm-finalize-JOBID.out, OUT_DIR/slurm-train-JOBID.out and "
                                   "OUT_DIR/slurm-convert-JOBID.out; with --wait a failed chain names its first "
                                   "failed job and its log.")
    c.add_argument("inputs", nargs="+", help="raw text inputs for data_prep build (files, directories, globs)")
    c.add_argument("--data", required=True, help="dataset directory to build (training reads it)")
    c.add_argument("--config", required=True, help="training config (YAML file or preset)")
    c.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="training config overrides (out_dir decides where the run and its HF export go)")
    c.add_argument("--tokenizer", help="an existing tokenizer for data_prep (default: train one in a first job)")
    c.add_argument("--vocab-size", type=whole("a number of pieces (e.g. 32000)"), default=32000,
                   help="vocabulary of the trained tokenizer")
    c.add_argument("--partitions", type=whole("a count (1, 2, ...)"), default=4, help="data_prep array tasks")
    c.add_argument("--nodes", type=whole("a count (1, 2, ...)"), default=1, help="training nodes")
    c.add_argument("--ntasks-per-node", type=whole("a count (1, 2, ...)"), default=1,
                   help="training processes per node (one per GPU)")
    c.add_argument("--gpus-per-node", type=whole("a count (0, 1, ...)", 0), default=0,
                   help="GPUs to ask for per node (0: none)")
    c.add_argument("--train-args", default="", help="more sbatch options for the training job (e.g. --time=24:00:00)")
    c.add_argument("--sbatch-args", default="", help="sbatch options for every job (e.g. --account=X --partition=Y)")
    c.add_argument("--wait", action="store_true", help="wait until the last job ends; exit with its status")
    return show_defaults(ap)


def write_hostfile(out: str, slots: int | None = None, environ=os.environ) -> list[str]:
    """`HOST slots=N` lines for the nodes of this Slurm job; returns them."""
    nodelist = environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise RendezvousError("SLURM_JOB_NODELIST is not set: run `ptm launch hostfile` inside a Slurm job")
    hosts = hostnames(nodelist)
    if slots is None:
        spec = environ.get("SLURM_TASKS_PER_NODE")
        counts = tasks_per_node(spec) if spec else []
        uniform_tasks_per_node(counts, "Slurm allocated", "SLURM_TASKS_PER_NODE", spec)
        slots = counts[0] if counts else int(environ.get("SLURM_GPUS_ON_NODE", 1))
    lines = [f"{host} slots={slots}" for host in hosts]
    try:
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")
    except OSError as e:
        raise RendezvousError(f"cannot write the hostfile {out} ({e.strerror}); choose another --out") from None
    return lines


def master(environ=os.environ) -> tuple[str, str]:
    """The master address and port of this Slurm job, as its srun tasks compute them."""
    nodelist = environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise RendezvousError("SLURM_JOB_NODELIST is not set: run `ptm launch master` inside a Slurm job")
    return node_address(hostnames(nodelist)[0]), str(job_port(environ))


def submit_chain(a) -> int:
    """Submit the prep -> train -> convert chain; returns the exit status (the last job's with --wait)."""
    import shlex
    import shutil
    import subprocess

    from data_prep import PrepError
    from data_prep.sources import expand_inputs
    from pretrain.config import ConfigError, load

    data = os.path.abspath(a.data)
    try:
        expand_inputs(a.inputs, None, data)  # (what the prep jobs will read: said now, before any job)
        out_dir = os.path.abspath(load(a.config, a.overrides).out_dir)
    except (PrepError, ConfigError) as e:
        raise RendezvousError(f"{e}; nothing was submitted") from None
    if a.tokenizer and not os.path.exists(a.tokenizer):
        raise RendezvousError(f"--tokenizer {a.tokenizer} not found; nothing was submitted")
    for what, path in (("--data", data), ("the config's out_dir", out_dir)):
        if os.path.exists(path) and not os.path.isdir(path):
            raise RendezvousError(f"{what} {path} is a file, not a directory; choose another")
        try:
            os.makedirs(path, exist_ok=True)  # (the jobs write their logs there)
        except OSError as e:
            raise RendezvousError(f"{what} {path} cannot be made ({e.strerror}); choose another") from None
    if shutil.which("sbatch") is None:
        raise RendezvousError("sbatch not found on PATH: submit from a host with Slurm's commands (a login node)")
    try:
        common, train_args = shlex.split(a.sbatch_args), shlex.split(a.train_args)
    except ValueError as e:
        raise RendezvousError(f"--sbatch-args {a.sbatch_args!r} / --train-args {a.train_args!r}: {e}") from None
    try:  # (a command line, as the scripts split it: "apptainer exec --nv ptm.sif python")
        py = shlex.split(os.environ["PTM_PYTHON"]) if os.environ.get("PTM_PYTHON") else [sys.executable]
    except ValueError as e:
        raise RendezvousError(f"PTM_PYTHON={os.environ['PTM_PYTHON']!r}: {e}; fix its quotes") from None
    slurm = shipped("slurm", "slurm")

    jobs, tokenizer = {}, a.tokenizer

    def sbatch(*args: str, after: str | None = None) -> str:
        """Submit one job; when sbatch fails, the jobs already submitted are cancelled (and named)."""
        cmd = ["sbatch", "--parsable", *common, *(["--dependency", f"afterok:{after}", "--kill-on-invalid-dep=yes"]
                                                   if after else []), *args]
        job = subprocess.run(cmd, capture_output=True, text=True)
        if job.returncode:
            cancelled = ""
            if jobs:
                with contextlib.suppress(OSError):  # (no scancel: they are named all the same)
                    subprocess.run(["scancel", *jobs.values()], capture_output=True)
                named = ", ".join(f"{name} {j}" for name, j in jobs.items())
                cancelled = f"; cancelled the jobs submitted before it ({named})"
            raise RendezvousError(f"sbatch failed ({' '.join(job.stderr.split())}): {shlex.join(cmd)}{cancelled}")
        return job.stdout.strip().split(";")[0]

    logs = {"prep": os.path.join(data, "slurm-prep-{}_*.out"), "finalize": os.path.join(data, "slurm-finalize-{}.out"),
            "train": os.path.join(out_dir, "slurm-train-{}.out"),
            "convert": os.path.join(out_dir, "slurm-convert-{}.out")}
    if tokenizer is None:
        tokenizer = data.rstrip("/") + "-tokenizer"
        logs["tokenizer"] = tokenizer + "-{}.out"
        jobs["tokenizer"] = sbatch("-J", "ptm-tokenizer", "-o", f"{tokenizer}-%j.out", "--wrap",
                                   shlex.join([*py, "-m", "data_prep", "train-tokenizer", *a.inputs, "--out", tokenizer,
                                               "--vocab-size", str(a.vocab_size)]))
    jobs["prep"] = sbatch(f"--array=0-{a.partitions - 1}", "-o", os.path.join(data, "slurm-prep-%A_%a.out"),
                          os.path.join(slurm, "prep.sbatch"), data, *a.inputs, "--tokenizer", tokenizer,
                          after=jobs.get("tokenizer"))
    jobs["finalize"] = sbatch("-J", "ptm-prep-finalize", "-o", os.path.join(data, "slurm-finalize-%j.out"), "--wrap",
                              shlex.join([*py, "-m", "data_prep", "finalize", data]), after=jobs["prep"])
    gpus = [f"--gpus-per-node={a.gpus_per_node}"] if a.gpus_per_node else []
    jobs["train"] = sbatch(f"--nodes={a.nodes}", f"--ntasks-per-node={a.ntasks_per_node}", *gpus,
                           "-o", os.path.join(out_dir, "slurm-train-%j.out"), *train_args,
                           os.path.join(slurm, "pretrain.sbatch"), a.config, "--set", *a.overrides, f"data.path={data}",
                           f"out_dir={out_dir}", after=jobs["finalize"])
    jobs["convert"] = sbatch("-o", os.path.join(out_dir, "slurm-convert-%j.out"), os.path.join(slurm, "convert.sbatch"),
                             out_dir, after=jobs["train"])
    for name, job in jobs.items():
        print(f"{name}: job {job}", flush=True)
    if not a.wait or wait_for(jobs["convert"]) == 0:
        return 0
    for name, job in jobs.items():  # the first that did not complete failed; the later ones were cancelled after it
        states = set(job_states(job)) - {"COMPLETED", "UNKNOWN"}  # (UNKNOWN: ended long ago, Slurm forgot it)
        if states:
            print(f"launchers: the {name} job {job} ended {sorted(states)[0]}; see {logs[name].format(job)}",
                  file=sys.stderr)
            break
    return 1


def torchrun(argv: list[str]) -> int:
    """torchrun ARGS in this process; returns its exit status. Where the ranks noted how they end (a stop signal that
    torchrun passed on to them, SIGUSR1 included, a bad input: `pretrain.signals.note_end`), that status, and the line
    one of them said stands alone, without torchrun's traceback (where none of them said it, rank 0 being on another
    node, a line of this launcher's: one per node); a signal that ended them before they noted one is one line and
    128 + its number; any other failure is torchrun's own report (ChildFailedError's traceback, exit 1)."""
    import signal
    import socket
    import tempfile

    from torch.distributed.elastic.multiprocessing.api import SignalException, _terminate_process_handler
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    from pretrain.signals import END_ENV

    sys.argv[0] = f"{parser().prog} torchrun"  # (torchrun's usage line)
    # SIGUSR1 (Slurm's --signal=USR1@T, `kill -USR1`) to torchrun itself, which would die of it and orphan the ranks:
    # handled as it handles SIGTERM, passed on to the ranks (they checkpoint and stop) and waited for
    signal.signal(signal.SIGUSR1, _terminate_process_handler)
    with tempfile.TemporaryDirectory(prefix="ptm-torchrun.") as end:
        note = os.environ[END_ENV] = os.path.join(end, "status")  # (the ranks of this node note their status there)
        _note_per_attempt(note)

        def agreed() -> int | None:
            with contextlib.suppress(OSError, ValueError), open(note) as f:
                return int(f.read())
            return None

        try:
            torchrun_main(argv)
        except SignalException as e:
            code, how = agreed(), f"stopped on {e.sigval.name}"
            if code is None:  # (no rank noted how it ended)
                code = 128 + e.sigval
                print(f"launchers: stopped by {e.sigval.name} before the ranks could checkpoint (exit {code}); re-run "
                      "the same command to resume from the last checkpoint", file=sys.stderr)
                return code
        except ChildFailedError as e:
            code, how = agreed(), "ended"
            if code is None or any(f.exitcode != code for f in e.failures.values()):
                raise
        else:
            return 0
        if not os.path.exists(f"{note}.line"):  # (no rank of this node said why: rank 0 is on another)
            print(f"launchers: the ranks on {socket.gethostname()} {how} as the job's ranks agreed (exit {code}); "
                  "rank 0's node says why", file=sys.stderr)
        return code


def _note_per_attempt(note: str) -> None:
    """torchrun rendezvouses again before it starts the ranks anew (--max-restarts, a node joining): the note of the
    ranks before goes then, so that an attempt that ends reads its own ranks' note, not an earlier attempt's."""
    from torch.distributed.elastic import metrics

    class Attempts(metrics.MetricHandler):
        def emit(self, metric_data) -> None:  # (`SimpleElasticAgent._rendezvous`'s, before `_start_workers`)
            if metric_data.name.endswith("._rendezvous.success"):
                for path in (note, f"{note}.line"):
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(path)

    metrics.configure(Attempts(), "torchelastic")


def job_states(job: str, env=None) -> list[str]:
    """A Slurm job's state, one per task of an array job; ["UNKNOWN"] for a job Slurm does not know (any more)."""
    import re
    import subprocess

    info = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, env=env).stdout
    return re.findall(r"JobState=(\S+)", info) or ["UNKNOWN"]


def wait_for(job: str, poll_s: float = 2.0, env=None) -> int:
    """Wait until a Slurm job ends, through its requeues (`sbatch --wait` may return at one); 0 when it
    completed, 1 otherwise."""
    import time

    while True:
        states = job_states(job, env)
        if not {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED"} & set(states):
            state = next((s for s in states if s != "COMPLETED"), "COMPLETED")
            print(f"job {job}: {state}", flush=True)
            return 0 if state == "COMPLETED" else 1
        time.sleep(poll_s)


def _sbatch_options_joined(argv: list[str]) -> list[str]:
    """`--train-args --time=24:00:00` as `--train-args=--time=24:00:00`: argparse takes a value that starts with
    `-` for an option and stops ("expected one argument")."""
    out = []
    for arg in argv:
        if out and out[-1] in ("--train-args", "--sbatch-args"):
            arg = f"{out.pop()}={arg}"
        out.append(arg)
    return out


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["torchrun"]:  # (the rest is torchrun's, passed on as it is)
        sys.exit(torchrun(argv[1:]))
    a = parser().parse_args(_sbatch_options_joined(argv))
    try:
        if a.command == "env":
            print(json.dumps(describe(), indent=2))
        elif a.command == "hostfile":
            print("\n".join(write_hostfile(a.out, a.slots)))
        elif a.command == "master":
            print(*master())
        else:
            sys.exit(submit_chain(a))
    except RendezvousError as e:
        print(f"launchers: error: {e}", file=sys.stderr)
        sys.exit(2)
