"""Stop signals: Slurm's warning before the time limit (--signal=USR1@N, or B:USR1@N forwarded by
slurm/pretrain.sbatch), scancel and preemption (SIGTERM).

A training process blocks them at its first line (`block`, from pretrain/__main__.py) and takes them in a thread of
its own (`sigwait`), so that one arriving while the run is still starting is kept for the first step boundary: the
trainer checkpoints there and exits. SIGTERM before the training loop has begun (`training`) ends the process at once
(exit TERMINATED), as it would without the block: there is nothing to checkpoint, and a launcher stopping the other
ranks after one failed (torchrun, the deepspeed launcher) waits 30 s for them before it kills them. A blocked signal
mask is inherited across fork and exec, so the children started afterwards (DeepSpeed's compiler probes, a ninja
build, Inductor's and Triton's compile workers, data-loader workers) never die of a stop signal that Slurm sends to
every process of the step: only the rank acts on it.

Stdlib only: this module runs before the slow imports (torch, DeepSpeed)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
PREEMPTED = 75  # the exit status of a run stopped by a signal after checkpointing (EX_TEMPFAIL: requeue and resume)
NO_PROGRESS = 5  # the exit status of a run stopped before its first step: requeueing it would loop without progress
TERMINATED = 128 + signal.SIGTERM  # the exit status of a process SIGTERM ended before its training loop began
received: str | None = None  # the name of the first stop signal this process got
trained_steps = 0  # steps trained since this process started (a failure while a stop is pending reads it)
training = False  # the training loop has begun: from here it acts on stop signals at its step boundaries
PAUSE_ENV = "PTM_TEST_PAUSE"  # "PHASE:DIR" makes `pause(PHASE)` wait (tests: a signal at a named moment)
END_ENV = "PTM_END_NOTE"  # a file for the exit status the ranks agreed on (slurm/pretrain.sbatch, launchers read it)
_waiter: threading.Thread | None = None
_paused: set[str] = set()


def _note(signum, frame=None) -> None:
    global received
    received = received or signal.Signals(signum).name
    where = os.environ.get(PAUSE_ENV, "").partition(":")[2]
    if where:  # (tests: the signal reached this rank)
        with open(os.path.join(where, f"signalled.{_rank()}"), "w") as f:
            f.write(received)


def _rank() -> str:
    return next((os.environ[k] for k in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK") if k in os.environ), "0")


def _take() -> None:
    while True:
        signum = signal.sigwait(STOP_SIGNALS)
        _note(signum)
        if signum == signal.SIGTERM and not training:
            os._exit(TERMINATED)


def block() -> None:
    """From now on, stop signals are blocked in this process and every thread and child it starts, and a thread
    of this process records them (`received`). Idempotent."""
    global _waiter
    if _waiter is None:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        _waiter = threading.Thread(target=_take, name="ptm-stop-signals", daemon=True)
        _waiter.start()


def watch() -> dict:
    """Remember stop signals from now on instead of dying of them (in a process that did not `block` them, e.g. a
    training run called from Python); returns the handlers this replaced."""
    return {s: signal.signal(s, _note) for s in STOP_SIGNALS}


def ignore() -> None:
    """For a process whose run is over: a late stop signal must not kill it while it exits (Python restores the
    default handlers, which terminate, when it shuts down)."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def restore(previous: dict) -> None:
    for s, handler in previous.items():
        signal.signal(s, handler)


def pause(phase: str) -> None:
    """A test hook at named moments of a run: with PTM_TEST_PAUSE=PHASE[@RANK][,PHASE[@RANK]...]:DIR, the process
    (of that rank, or every one) reaching PHASE the first time writes DIR/PHASE.RANK and waits until DIR/go.PHASE
    exists (at most 10 minutes), in a child process, as a ninja build or a compile worker would: a child that dies
    fails the run, as a build that a stop signal killed did (at `start`, before the handlers, in the process itself).
    A stop signal a rank records then writes DIR/signalled.RANK. Phases: start (before `block`), imports, build,
    workers, collective, evaluation, checkpoint, last, exit (after the ranks agreed to stop: a rank slower to end)
    (pretrain/__main__.py, engine.py, train.py, checkpoint.py, cli.py)."""
    phases, _, where = os.environ.get(PAUSE_ENV, "").partition(":")
    at = {p.partition("@")[0]: p.partition("@")[2] for p in phases.split(",")}
    if phase not in at or not where or at[phase] not in ("", _rank()) or phase in _paused:
        return
    _paused.add(phase)
    with open(os.path.join(where, f"{phase}.{_rank()}"), "w") as f:
        f.write(str(os.getpid()))
    go = os.path.join(where, f"go.{phase}")
    wait = f"import os, time\nfor _ in range(6000):\n    if os.path.exists({go!r}): break\n    time.sleep(0.1)"
    if phase == "start":  # before the handlers: the process as the interpreter starts it, no child
        exec(wait)
    else:
        subprocess.run([sys.executable, "-c", wait], check=True)


def note_end(code: int, line: str | None = None) -> None:
    """Record the exit status this rank ends with, having stopped on a signal or refused its input (2), in
    $PTM_END_NOTE (set by slurm/pretrain.sbatch and `ptm launch torchrun`: a file in a directory on the batch host, or
    on torchrun's, so ranks elsewhere find no directory and write nothing), and the `line` that says why, if this
    rank says it, beside it ($PTM_END_NOTE.line; `ptm launch torchrun` on a node without one says a line of its
    own). A launcher that sees one rank exit kills the ranks still ending (srun --kill-on-bad-exit) and reports that
    kill, not the status the ranks agreed on; the script reads this note instead. Atomic; callable from any thread."""
    from ptm.files import write_text  # (stdlib only)

    path = os.environ.get(END_ENV)
    if path:
        try:
            if line is not None:  # (first: the script waits for the status)
                write_text(f"{path}.line", line)
            write_text(path, str(code))
        except OSError:
            pass


def end_line(line: str, code: int) -> None:
    """The rank that says why the job ends: `line` on stderr, then `note_end`. A launcher's output may be gone by then
    (mpirun, which scancel's SIGTERM ends: its ranks' pipes close), so writing never raises; slurm/pretrain.sbatch
    says the noted line then."""
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass
    note_end(code, line)


def no_progress(signal_name: str | None, since: str) -> str:
    """The line that ends a job stopped before its first step since it (re)started (exit 5): a requeue would stop at
    the same step again, forever."""
    limit = slurm_time_limit()
    return (f"stopped by {signal_name or 'a signal to another rank'} before the first step {since}: a requeue would "
            "stop here again, so the job ends (exit 5, not requeued); "
            + (f"its time limit ({limit}) is" if limit else "a time limit") + " shorter than the stop signal's lead "
            "plus start-up: raise --time, or lower the lead (--signal=B:USR1@LEAD; slurm/pretrain.sbatch sets 300 s)")


def stopped_during(failure: str) -> tuple[str, int]:
    """A failure while a stop signal is pending (a peer or child that died of it before it was blocked, a collective
    that broke) is that stop: the line and exit status 5 (the no-progress stop) when this process trained no step,
    else 75 (requeue: the last complete checkpoint stays, its writes being atomic). Callable from any thread (the
    heartbeat's judge)."""
    if trained_steps == 0:
        return "pretrain: error: " + no_progress(received, "since the job (re)started"), NO_PROGRESS
    return (f"pretrain: stopped by {received} after {trained_steps} steps, but the ranks could not checkpoint together "
            f"({failure}): the last complete checkpoint stays; exit {PREEMPTED}: requeue or resubmit the job to resume "
            "from it"), PREEMPTED


def slurm_time_limit() -> str | None:
    """This Slurm job's time limit as scontrol shows it (e.g. "00:05:00"), or None outside Slurm."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        info = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return info.split("TimeLimit=", 1)[1].split()[0] if "TimeLimit=" in info else None


if __name__ == "__main__":  # slurm/pretrain.sbatch: `python -m pretrain.signals no-progress SIGNAL`
    print("pretrain: error: " + no_progress(sys.argv[2] if len(sys.argv) > 2 else None,
                                            "since the job (re)started (a task ended during start-up)"))
