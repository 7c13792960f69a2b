"""Feeding samples to training: a torch Dataset over a source, a resumable distributed sampler, a loader.

The sampler walks one global stream of positions p = 0, 1, 2, ... over all data-parallel ranks; position p
is sample p % len(source) of epoch p // len(source), and rank r of w takes the positions p with
p % w == r. So each epoch is split into disjoint per-rank slices that together cover it, epochs advance
by themselves, and a run resumes exactly from `consumed_samples` (the global count, as Megatron keeps it).
"""
from __future__ import annotations

import functools
import math
import re
import signal
import weakref

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from pretrain.data.packing import pack


class SampleDataset(Dataset):
    """A source as a map-style torch Dataset keyed by (epoch, index)."""

    def __init__(self, source):
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, key: tuple[int, int]) -> dict[str, np.ndarray]:
        return self.source.sample(*key)


class DistributedSampler(Sampler):
    """(epoch, index) keys of rank `rank` of `world_size`, from global position `consumed_samples` up to
    `total_samples` (None: endless). Each epoch's index maps are prepared here, in the main process,
    before its first key goes to the workers."""

    def __init__(self, source, *, rank: int = 0, world_size: int = 1, consumed_samples: int = 0,
                 total_samples: int | None = None):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        self.source, self.rank, self.world_size = source, rank, world_size
        self.start = consumed_samples + (rank - consumed_samples) % world_size  # first position of this rank
        self.total_samples = total_samples

    def __iter__(self):
        n, epoch, p = len(self.source), None, self.start
        while self.total_samples is None or p < self.total_samples:
            e, i = divmod(p, n)
            if e != epoch:
                self.source.prepare(e)
                epoch = e
            yield e, i
            p += self.world_size

    def __len__(self) -> int:
        if self.total_samples is None:
            raise TypeError("an endless sampler (total_samples=None) has no length")
        return max(0, -(-(self.total_samples - self.start) // self.world_size))


def collate(samples: list[dict[str, np.ndarray]], unpadded: bool = False, locate=None) -> dict[str, torch.Tensor]:
    """Stack samples into int64 tensors that are views of one storage, so that a worker hands a batch
    over as one shared-memory block (twice the throughput of one block per field); `unpadded` packs the
    batch (pretrain/data/packing.py) and `locate` adds its loss terms' element indices (`Objective.locate`) here,
    in the worker, on the host, rather than in the training process on the device."""
    shapes = {k: np.shape(v) for k, v in samples[0].items()}
    flat = torch.empty(len(samples) * sum(math.prod(s) for s in shapes.values()), dtype=torch.int64)
    out, at = {}, 0
    for k, shape in shapes.items():
        out[k] = flat[at:at + len(samples) * math.prod(shape)].view(len(samples), *shape)
        np.stack([s[k] for s in samples], out=out[k].numpy())
        at += out[k].numel()
    out = pack(out) if unpadded else out
    return locate(out) if locate else out


def make_loader(source, micro_batch_size: int, *, rank: int = 0, world_size: int = 1, consumed_samples: int = 0,
                total_samples: int | None = None, num_workers: int = 2, unpadded: bool = False,
                locate=None) -> DataLoader:
    """Micro-batches of this rank's samples (packed when `unpadded`, with `locate`'s fields: `collate`); worker
    processes when num_workers > 0, pinned memory when CUDA is available. The loader has its own torch generator:
    starting it never draws from the global RNG (dropout), so a resumed run stays exact."""
    sampler = DistributedSampler(source, rank=rank, world_size=world_size, consumed_samples=consumed_samples,
                                 total_samples=total_samples)
    with torch.autograd.profiler.record_function("ptm: a loader"):  # (imports now what its first batch would: a
        pass  # worker's death signalled during that import was a warning with a traceback, and said no more)
    return _Loader(SampleDataset(source), batch_size=micro_batch_size, sampler=sampler,
                   collate_fn=functools.partial(collate, unpadded=unpadded, locate=locate),
                   num_workers=num_workers, pin_memory=torch.cuda.is_available(), persistent_workers=num_workers > 0,
                   generator=torch.Generator(), worker_init_fn=_ignore_stop_signals)


class _Loader(DataLoader):
    """torch's DataLoader, whose iterators `worker_death` can ask how a worker of theirs ended."""

    def _get_iterator(self):
        batches = super()._get_iterator()
        _ITERATORS.add(batches)
        return batches


_ITERATORS = weakref.WeakSet()


def end_workers(batches) -> None:
    """End the worker processes of a loader's iterator now (no-op without workers). Whatever ends a run must: they
    ignore SIGTERM (`_ignore_stop_signals`), which is how multiprocessing ends them at exit before it waits for them,
    so an iterator that a traceback keeps alive past that point kept the process waiting forever."""
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def _ignore_stop_signals(worker_id: int) -> None:
    """Workers leave SIGTERM/SIGUSR1 (scancel, Slurm's warning) to the training process, which checkpoints before
    it exits; they end with it (`end_workers`)."""
    for s in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(s, signal.SIG_IGN)


# torch's words for a worker that died (torch/csrc/DataLoader.cpp, torch/utils/data/dataloader.py)
_DIED = re.compile(r"DataLoader worker \(pid\(?s?\)? ([\d, ]+)\) (?:is killed by signal: ([^.]+)|exited unexpectedly)")


def _signal_of(pids: str) -> str | None:
    """The signal that ended the first of `pids` among the workers of the loaders' iterators made here, as torch
    names it ("Bus error"), where torch's message did not say (a worker found dead "exited unexpectedly")."""
    for batches in list(_ITERATORS):
        for worker in getattr(batches, "_workers", ()):
            if str(worker.pid) == pids.split(",")[0].strip() and (worker.exitcode or 0) < 0:
                return signal.strsignal(-worker.exitcode)
    return None


def worker_death(e: BaseException) -> str | None:
    """What torch's loader raises when one of its workers died, said as what to do; None for any other failure."""
    died = _DIED.search(str(e))
    if died is None:
        return None
    pid, signal_name = died[1], died[2] or _signal_of(died[1])
    if signal_name == "Bus error":  # what a worker's tensors in a full /dev/shm get
        return (f"data-loader worker (pid {pid}) was killed by SIGBUS: shared memory (/dev/shm) ran out; raise its "
                "size (docker --shm-size) or set data.num_workers lower, then re-run the same command to resume "
                "from the last checkpoint")
    how = f"was killed ({signal_name})" if signal_name else "exited unexpectedly"
    return (f"data-loader worker (pid {pid}) {how}, most often by the system's out-of-memory killer (the job's memory "
            "report or `dmesg` says so); give the job more memory or set data.num_workers lower, then re-run the "
            "same command to resume from the last checkpoint")
