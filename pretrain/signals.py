"""Stop signals: Slurm's warning before the time limit (--signal=USR1@N), scancel and preemption (SIGTERM).
Watched from the start of the process, so that one arriving while a run is still starting is not lost: the
trainer checkpoints at its next step boundary and exits."""
from __future__ import annotations

import signal

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
