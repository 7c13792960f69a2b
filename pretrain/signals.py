"""Stop signals: Slurm's warning before the time limit (--signal=USR1@N), scancel and preemption (SIGTERM).
Watched from the start of the process, so that one arriving while a run is still starting is not lost: the
trainer checkpoints at its next step boundary and exits."""
from __future__ import annotations

import os
import signal
import subprocess

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
received: str | None = None  # the name of the first stop signal this process got


def _note(signum, frame) -> None:
    global received
    received = received or signal.Signals(signum).name


def watch() -> dict:
    """Remember stop signals from now on instead of dying of them; returns the handlers this replaced."""
    return {s: signal.signal(s, _note) for s in STOP_SIGNALS}


def ignore() -> None:
    """For a process whose run is over: a late stop signal must not kill it while it exits (Python restores the
    default handlers, which terminate, when it shuts down)."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def restore(previous: dict) -> None:
    for s, handler in previous.items():
        signal.signal(s, handler)


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
