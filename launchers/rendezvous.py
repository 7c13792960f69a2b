"""Who am I in the job: one contract for every launcher. torchrun and the deepspeed launcher set RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT themselves; under Open MPI (`mpirun`) the rank comes from
its OMPI_COMM_WORLD_* variables and is exported under torch's names, so that `torch.distributed`'s `env://`
rendezvous and DeepSpeed see the same thing whoever started the processes.

MASTER_ADDR defaults to 127.0.0.1 when every rank runs on one node; across nodes it must be given (the first
host of the job). MASTER_PORT defaults to 29500.
"""
from __future__ import annotations

import os

DEFAULT_PORT = "29500"


class RendezvousError(RuntimeError):
    """The environment does not say enough to join the job; the message names what to set."""


def export(environ=os.environ) -> str | None:
    """Fill RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT from the launcher that started this process;
    returns its name, or None for a single process that no launcher started. torch's own variables win."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return "torchrun/deepspeed"
    size = environ.get("OMPI_COMM_WORLD_SIZE")
    if size is None or int(size) == 1:
        return None
    if "MASTER_ADDR" not in environ and environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") != size:
        raise RendezvousError(f"started by mpirun with {size} processes on several nodes, but MASTER_ADDR is not "
                              "set; run mpirun -x MASTER_ADDR=<first host> -x MASTER_PORT=<port> ...")
    environ.update(RANK=environ["OMPI_COMM_WORLD_RANK"], WORLD_SIZE=size,
                   LOCAL_RANK=environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    environ.setdefault("MASTER_ADDR", "127.0.0.1")
    environ.setdefault("MASTER_PORT", DEFAULT_PORT)
    return "mpirun"
