"""Lost contact, said the same way on every backend. gloo raises when a collective times out, and pretrain/cli.py turns
that into one line and exit 4; NCCL's watchdog instead aborts the process (SIGABRT, C++ stacks) while the main thread
waits in `.item()`. So no backend timeout may act first:

* a `beat` thread adds 1 to this rank's counter in the rendezvous store every `parallel.heartbeat_s` and reads the
  counter of the next rank (a ring: O(1) store calls per rank and beat, and of any set of silent ranks short of all,
  one has a live predecessor);
* a `judge` thread, which never touches the network (a store call to a stalled host blocks for ever), ends the
  process with the line and exit 4 when the next rank's counter has not moved for `parallel.timeout_s` while the
  store answers (naming that rank and its host; the verdict is posted to the store, so every rank ends within a beat),
  when the store has not answered for `parallel.timeout_s` (its keeper, rank 0 or torchrun's agent, is dead or
  stalled), or when another rank posted a verdict.

Only a dead or stopped process stops beating: a long checkpoint write or evaluation beats on while peers wait. The
process groups' own timeout is `collective_timeout_s` (2 x timeout_s + 3 beats), so a rank that goes silent while a
collective already waits for it is named before gloo raises or NCCL's watchdog acts.

A process that beats while its main thread is stuck (a hung data loader, a device that stopped, a deadlock) is caught
by its peers' main threads instead: the trainer marks its progress (`progress`: a numbered point such as "step 12:
micro-batch 2 of 4", the same sequence on every rank), the beat thread posts this rank's mark when it changes, and
when this rank's main thread has stayed at one mark for `stall_s` (2 x timeout_s - 2 beats: before the collective
timeout of 2 x timeout_s + 3 beats would end it anyway, and after a silent peer's verdict) the beat thread reads
every rank's mark once and the judge ends the process with the line, naming the ranks still at an earlier point, or
saying that every rank waits at the same point (a collective that does not complete: a stuck device or the network).
A mark made `patient` (a checkpoint write, which may take long with no collective) is never judged.

NCCL reads `NCCL_ENV` (set unless the user set it) when the group is built: TORCH_NCCL_ASYNC_ERROR_HANDLING=3 ends a process whose collective failed or timed out without calling
ncclCommAbort, which can hang on a dead peer (torchrun sets 1, which aborts first, then ends it too; 0 would hang and 2
would let the main thread go on with garbage); TORCH_NCCL_BLOCKING_WAIT=0 keeps collectives asynchronous (blocking
waits would make the host wait for every collective).
"""
from __future__ import annotations

import os
import socket
import threading
import time

import torch.distributed as dist

from pretrain import signals
from pretrain.runlog import failed

LOST_CONTACT = 4  # the exit status of a rank that lost contact with the others
NCCL_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_BLOCKING_WAIT": "0"}

_running: Heartbeat | None = None
_generation = 0  # Trainers of one process group start in step; each gets fresh keys


def lost_contact(rank: int, reason: str) -> str:
    """The one line every path ends with (cli.py prints it for a collective that raised)."""
    return (f"pretrain: error: rank {rank} on {socket.gethostname()} lost contact with the other ranks ({reason}); "
            "resubmit to resume from the last checkpoint")


def collective_timeout_s(parallel) -> float:
    """The process groups' timeout: past every verdict of a rank gone silent after a collective began to wait."""
    return 2 * parallel.timeout_s + 3 * parallel.heartbeat_s


def stall_time_s(timeout_s: float, heartbeat_s: float) -> float:
    """How long a main thread may stay at one mark: 5 beats before the collective timeout (room for the census, the
    judge and a margin), and at least a beat after a silent peer's verdict."""
    return max(2 * timeout_s - 2 * heartbeat_s, timeout_s + heartbeat_s)


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


class Heartbeat:
    """This rank's beat and its judge of the next rank (see the module's docstring)."""

    def __init__(self, store, rank: int, world: int, timeout_s: float, interval_s: float, prefix: str,
                 stall_s: float | None = None):
        self.store, self.rank, self.world, self.peer, self.prefix = store, rank, world, (rank + 1) % world, prefix
        self.timeout_s, self.interval_s = timeout_s, interval_s
        self.stall_s = stall_time_s(timeout_s, interval_s) if stall_s is None else stall_s
        self.mark = (0, "the start", time.monotonic(), True)  # the main thread's (number, point, since, patient)
        self.posted_mark = None  # the number of the mark last posted to the store
        self.census = None  # every rank's (mark number, point, host), read once the main thread is stalled
        self.heard = self.answered = time.monotonic()  # the peer's counter last moved / the store last answered
        self.count = self.peer_host = self.posted = None
        self.store_error = ""
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=run, name=f"ptm-heartbeat-{run.__name__[1:]}", daemon=True)
                         for run in (self._beat, self._judge)]
        for t in self._threads:
            t.start()

    def _key(self, name) -> str:
        return f"{self.prefix}/{name}"

    def _beat(self) -> None:
        store = None
        while True:
            try:
                if store is None:
                    store = self.store.clone()  # a connection of its own: the main thread's is not thread-safe
                    store.set(self._key(f"host/{self.rank}"), socket.gethostname())
                store.add(self._key(self.rank), 1)
                count = store.add(self._key(self.peer), 0)
                if self.peer_host is None and store.check([self._key(f"host/{self.peer}")]):
                    self.peer_host = store.get(self._key(f"host/{self.peer}")).decode()
                if store.check([self._key("verdict")]):
                    self.posted = store.get(self._key("verdict")).decode()
                number, point, since, _ = mark = self.mark
                if number != self.posted_mark:
                    store.set(self._key(f"mark/{self.rank}"), f"{number} {point}")
                    self.posted_mark, self.census = number, None
                if self.census is None and time.monotonic() - since > self.stall_s:
                    self.census = (mark, self._read_marks(store))
                now = time.monotonic()
                if count != self.count:
                    self.count, self.heard = count, now
                self.answered = now
            except RuntimeError as e:  # DistError and friends: reconnect at the next beat
                store, self.store_error = None, first_line(e)
            if self._stop.wait(self.interval_s):
                return

    def _read_marks(self, store) -> list[tuple[int, int, str, str]]:
        """(rank, mark number, point, host) of every rank whose mark and host are in the store."""
        found = []
        for rank in range(self.world):
            keys = [self._key(f"mark/{rank}"), self._key(f"host/{rank}")]
            if store.check(keys):
                mark, host = (v.decode() for v in store.multi_get(keys))
                number, _, point = mark.partition(" ")
                found.append((rank, int(number), point, host))
        return found

    def progressed(self, point: str, patient: bool = False) -> None:
        """The main thread reached `point` (see `progress`)."""
        self.mark = (self.mark[0] + 1, point, time.monotonic(), patient)

    def stalled(self, now: float) -> str | None:
        """Why this rank's main thread, at one mark for stall_s, is waiting in vain, once the census is read."""
        number, point, since, patient = self.mark
        if patient or now - since <= self.stall_s or self.census is None or self.census[0][0] != number:
            return None
        if any(n > number for _, n, _, _ in self.census[1]):
            return None  # others went on: this rank is the one behind, and theirs will name it
        behind = [f"rank {r} on {host}, still at {p}" for r, n, p, host in self.census[1]
                  if n < number and r != self.rank]
        if behind:
            more = f" and {len(behind) - 4} more" if len(behind) > 4 else ""
            return f"it has waited {now - since:.0f} s at {point} for {'; '.join(behind[:4])}{more}"
        return (f"every rank has waited {now - since:.0f} s at {point}: a collective has not completed (a stuck device "
                "or the network)")

    def verdict(self, now: float) -> str | None:
        """Why this rank must give up now, if it must."""
        if self.posted:
            return self.posted
        if now - self.answered > self.timeout_s:
            keeper = "torchrun's agent" if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" else "rank 0"
            where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
            return (f"the rendezvous store at {where}, kept by {keeper}, has not answered for "
                    f"{now - self.answered:.0f} s" + (f": {self.store_error}" if self.store_error else ""))
        if now - self.heard > self.timeout_s and now - self.answered <= 2 * self.interval_s:
            return (f"rank {self.peer} on {self.peer_host or 'an unknown host'} has not been heard from for "
                    f"{now - self.heard:.0f} s")
        return self.stalled(now)

    def _judge(self) -> None:
        while not self._stop.wait(self.interval_s):
            reason = self.verdict(time.monotonic())
            if reason and not self._stop.is_set():
                line, code = signals.stopped_during(reason) if signals.received else (
                    lost_contact(self.rank, reason), LOST_CONTACT)
                # tell the others, then keep the line in out_dir, a beat at most each (best effort: the store may be
                # what is gone, out_dir on a stalled file system)
                tasks = ([(self._post, (reason,))] if self.posted is None else []) + [(failed, (line, code))]
                for thread in [threading.Thread(target=f, args=args, daemon=True) for f, args in tasks]:
                    thread.start()
                    thread.join(self.interval_s)
                if signals.received and self.rank == 0:  # (the rank that says it notes it)
                    signals.end_line(line, code)
                elif code == LOST_CONTACT or self.rank == 0:
                    os.write(2, (line + "\n").encode())
                os._exit(code)

    def _post(self, reason: str) -> None:
        try:
            self.store.clone().set(self._key("verdict"), reason)
        except RuntimeError:
            pass

    def stop(self) -> None:
        """Stop both threads; a beat blocked in a store call is left to end with the process (it judges nothing)."""
        self._stop.set()
        self._threads[1].join()
        self._threads[0].join(self.interval_s)


def start(parallel) -> None:
    """Beat and judge in this process while it is one of several ranks (a running heartbeat is replaced)."""
    global _running, _generation
    stop()
    if not dist.is_initialized() or dist.get_world_size() == 1 or min(parallel.timeout_s, parallel.heartbeat_s) <= 0:
        return  # a bad value: cfg.validate names it
    _generation += 1
    _running = Heartbeat(dist.distributed_c10d._get_default_store(), dist.get_rank(), dist.get_world_size(),
                         parallel.timeout_s, parallel.heartbeat_s, f"ptm/heartbeat/{_generation}")


def progress(point: str, patient: bool = False) -> None:
    """This rank's main thread reached `point` ("step 12: micro-batch 2 of 4"), a point every rank passes in the same
    order; `patient`: it may stay there long without waiting for another rank (a checkpoint write). No-op without a
    running heartbeat; costs an attribute write."""
    if _running is not None:
        _running.progressed(point, patient)


def stop() -> None:
    """Stop this process's heartbeat, if any (the end of a Trainer or of the process group)."""
    global _running
    if _running is not None:
        _running.stop()
        _running = None
