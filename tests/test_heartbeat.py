"""The stall census of pretrain/heartbeat.py taken by the heartbeat's own beat thread, in one process: what the
verdict of a stalled main thread is made from (the two-process run is in tests/test_launchers.py)."""
import re
import socket
import time
from datetime import timedelta

import torch.distributed as dist

from conftest import free_port
from pretrain.heartbeat import Heartbeat


class Watched(Heartbeat):
    """A heartbeat whose judge gives no verdict: the real one ends the process (os._exit) with it; the test asks
    `stalled` instead."""

    def _judge(self) -> None:
        self._stop.wait()


def _census(beat: Heartbeat, number: int) -> tuple:
    """The census the beat thread has taken at mark `number`, once it has (10 s at most)."""
    deadline = time.monotonic() + 10
    while beat.census is None or beat.census[0][0] != number:
        assert time.monotonic() < deadline, f"no census at mark {number} after 10 s: {beat.census}"
        time.sleep(0.01)
    return beat.census


def test_the_beat_thread_takes_the_census_once_the_main_thread_has_stalled():
    """The beat thread posts this rank's mark; once the main thread has stayed at it for stall_s, it reads every
    rank's mark and host from the store, and the verdict names the ranks behind from that census; a new mark drops
    it, and the census is taken again stall_s later. Ranks 1 and 2 are this test writing their marks and hosts into a
    real store."""
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=timedelta(seconds=5))
    for rank, mark in ((1, "1 step 1: loading its micro-batches"), (2, "2 step 1: micro-batch 1 of 2")):
        store.set(f"t/host/{rank}", f"node{rank}")
        store.set(f"t/mark/{rank}", mark)
    beat = Watched(store, rank=0, world=3, timeout_s=60, interval_s=0.02, prefix="t", stall_s=0.3)
    try:
        for point in ("step 1: loading its micro-batches", "step 1: micro-batch 1 of 2", "step 1: micro-batch 2 of 2"):
            beat.progressed(point)
        mark, found = _census(beat, 3)
        assert mark == beat.mark and time.monotonic() - mark[2] > beat.stall_s  # not before stall_s
        assert found == [(0, 3, "step 1: micro-batch 2 of 2", socket.gethostname()),
                         (1, 1, "step 1: loading its micro-batches", "node1"),
                         (2, 2, "step 1: micro-batch 1 of 2", "node2")]
        verdict = beat.stalled(time.monotonic())
        assert re.fullmatch(r"it has waited \d+ s at step 1: micro-batch 2 of 2 for rank 1 on node1, still at step 1: "
                            r"loading its micro-batches; rank 2 on node2, still at step 1: micro-batch 1 of 2",
                            verdict), verdict
        beat.progressed("step 2: loading its micro-batches")
        mark, found = _census(beat, 4)
        assert time.monotonic() - mark[2] > beat.stall_s and found[0][1:3] == (4, "step 2: loading its micro-batches")
    finally:
        beat.stop()


def test_a_pending_stop_is_reported_from_the_judge_thread(monkeypatch):
    """The judge (a thread) reports a failure while a stop signal is pending as that stop: exit 5 and the no-progress
    line before any step, 75 after; no signal call from a thread (Python refuses those outside the main thread)."""
    import threading

    from pretrain import signals

    monkeypatch.setattr(signals, "received", "SIGUSR1")
    got = []
    for steps in (0, 3):
        monkeypatch.setattr(signals, "trained_steps", steps)
        judge = threading.Thread(target=lambda: got.append(signals.stopped_during("rank 1 has not been heard from")))
        judge.start()
        judge.join()
    assert [code for _, code in got] == [signals.NO_PROGRESS, signals.PREEMPTED], got
    assert got[0][0].startswith("pretrain: error: stopped by SIGUSR1 before the first step since the job (re)started")
    assert "after 3 steps" in got[1][0] and "rank 1 has not been heard from" in got[1][0]


def test_sigterm_ends_a_rank_at_once_before_its_training_loop_and_is_kept_after():
    """A rank blocks the stop signals at its first line (signals.block); SIGTERM before its training loop begins ends
    it at once with exit 143 (torchrun stops the other ranks with it when one fails, and would wait 30 s before
    killing them), after it the signal is kept for the step boundary; SIGUSR1 is always kept."""
    import subprocess
    import sys

    from conftest import ROOT
    from pretrain import signals

    script = ("import os, signal, sys, time\nfrom pretrain import signals\nsignals.block()\n"
              "signals.training = sys.argv[1] == 'training'\nos.kill(os.getpid(), getattr(signal, sys.argv[2]))\n"
              "time.sleep(2)\nprint(signals.received)")
    ran = {(when, name): subprocess.run([sys.executable, "-c", script, when, name], cwd=ROOT, capture_output=True,
                                        text=True, timeout=60) for when in ("starting", "training")
           for name in ("SIGTERM", "SIGUSR1")}
    assert ran["starting", "SIGTERM"].returncode == signals.TERMINATED == 143
    assert not ran["starting", "SIGTERM"].stdout  # (it did not sleep on)
    for kept in (("starting", "SIGUSR1"), ("training", "SIGTERM"), ("training", "SIGUSR1")):
        assert (ran[kept].returncode, ran[kept].stdout.strip()) == (0, kept[1]), ran[kept]
