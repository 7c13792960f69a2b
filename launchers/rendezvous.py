"""Who am I in the job: one contract for every launcher. Whatever started the processes, the rank, local rank,
world size, node count and the master's address and port end up in torch's variables (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT), so that `torch.distributed`'s `env://`
rendezvous and DeepSpeed see the same thing:

    torchrun, the deepspeed launcher (pdsh, --no_ssh)   set torch's variables themselves: they win
    mpirun / mpiexec, Open MPI                           OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}
    mpirun_rsh, MVAPICH                                  MV2_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}
    mpiexec, MPICH / Intel MPI (hydra)                   PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
    mpiexec, Cray PALS                                   PMI_RANK, PMI_SIZE, PMI_LOCAL_RANK, PMI_LOCAL_SIZE
    srun (also the deepspeed launcher's slurm backend)   SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NUM_TASKS,
                                                         SLURM_STEP_NUM_NODES, SLURM_NODEID, SLURM_STEP_NODELIST

PMI_RANK and PMI_SIZE without a local rank are srun's (--mpi=pmi2), not a launcher's; more than one process that no
launcher here started is refused. Under MPI on one node MASTER_ADDR defaults to 127.0.0.1; across nodes it must be
given (mpirun -x, mpiexec -genv). Under srun the master is the first host of the step's node list (`scontrol show
hostnames`), at its Slurm NodeAddr when the name does not resolve, and the port is derived from the job id, so every
task computes the same one.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
from dataclasses import asdict, dataclass

DEFAULT_PORT = "29500"


class RendezvousError(RuntimeError):
    """The environment does not say enough to join the job, or says contradictory things; the message names the
    variable and the fix."""


@dataclass
class Rendezvous:
    """What the launcher told this process."""

    launcher: str
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    nodes: int
    node_rank: int
    master_addr: str
    master_port: str


def detect(environ=os.environ) -> Rendezvous | None:
    """The launcher that started this process and what it says; None for a single process that none started."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return _torch(environ)
    for have, lack in (("RANK", "WORLD_SIZE"), ("WORLD_SIZE", "RANK")):
        if have in environ:
            raise RendezvousError(f"{have}={environ[have]} is set but {lack} is not: set both (torchrun and the "
                                  "deepspeed launcher do) or neither")
    for name, sign, rank_, size, local_rank, local_size, give in MPI:
        if environ.get(sign) and environ.get(size):
            return _mpi(environ, name, rank_, size, local_rank, local_size, give)
    if environ.get("SLURM_STEP_ID") and environ.get("SLURM_PROCID") and environ.get("SLURM_STEP_NUM_TASKS"):
        return _srun(environ)  # (srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE too, but no local rank)
    for size in dict.fromkeys(m[3] for m in MPI):
        if environ.get(size) and _count(environ, size) > 1:
            raise RendezvousError(f"{size}={environ[size]} says an MPI launcher started {environ[size]} processes, but "
                                  "none ptm knows (no local rank: MPI_LOCALRANKID, PMI_LOCAL_RANK; no srun step): "
                                  "start them with mpirun, mpiexec, srun or torchrun")
    return None


def rank(environ=os.environ) -> int:
    """This process's rank as its launcher says it, before or after the process group exists: 0 for a single process
    (and where the environment contradicts itself: `export` says what is wrong when the run starts)."""
    try:
        found = detect(environ)
    except RendezvousError:
        return 0
    return found.rank if found else 0


def export(environ=os.environ) -> str | None:
    """Fill torch's variables from the launcher that started this process; returns its name, or None for a
    single process that no launcher started."""
    found = detect(environ)
    if found is None or found.world_size == 1 and found.launcher != "torchrun/deepspeed":
        return None
    environ.update(RANK=str(found.rank), LOCAL_RANK=str(found.local_rank), WORLD_SIZE=str(found.world_size),
                   LOCAL_WORLD_SIZE=str(found.local_world_size), NODE_RANK=str(found.node_rank),
                   MASTER_ADDR=found.master_addr, MASTER_PORT=found.master_port)
    return found.launcher


def _int(environ, name: str, default: str | None = None) -> int:
    value = environ.get(name, default)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise RendezvousError(f"{name}={value!r} is not a whole number; check how the job was launched") from None


def _count(environ, name: str, default: str | None = None) -> int:
    """A number of processes or nodes: 1 or more."""
    value = _int(environ, name, default)
    if value < 1:
        raise RendezvousError(f"{name}={value} must be 1 or more; check how the job was launched")
    return value


def _rank(environ, name: str, size_name: str, size: int) -> int:
    """A rank: 0 up to `size` (from `size_name`) less one."""
    value = _int(environ, name)
    if not 0 <= value < size:
        raise RendezvousError(f"{name}={value} is outside 0..{size - 1} ({size_name}={size}); check how the job was "
                              "launched")
    return value


def _torch(environ) -> Rendezvous:
    """torchrun sets LOCAL_WORLD_SIZE and GROUP_RANK; the deepspeed launcher LOCAL_SIZE, CROSS_RANK, CROSS_SIZE."""
    size = _count(environ, "WORLD_SIZE")
    local_size = _count(environ, "LOCAL_WORLD_SIZE", environ.get("LOCAL_SIZE", str(size)))
    node_rank = _int(environ, "NODE_RANK", environ.get("GROUP_RANK", environ.get("CROSS_RANK", "0")))
    return Rendezvous("torchrun/deepspeed", _rank(environ, "RANK", "WORLD_SIZE", size),
                      _int(environ, "LOCAL_RANK", "0"), size, local_size, -(-size // local_size), node_rank,
                      environ.get("MASTER_ADDR", "127.0.0.1"), environ.get("MASTER_PORT", DEFAULT_PORT))


MPI = (  # (launcher, the variable that says it started this process, rank, size, local rank, local size, how to
    # give every rank MASTER_ADDR and MASTER_PORT): PMI_RANK/PMI_SIZE alone are no launcher (srun --mpi=pmi2 sets them)
    ("mpirun (Open MPI)", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
     "mpirun -x MASTER_ADDR=<first host> -x MASTER_PORT=<port>"),
    ("mpirun_rsh (MVAPICH)", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
     "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE",
     "mpirun_rsh ... MASTER_ADDR=<first host> MASTER_PORT=<port>"),
    ("mpiexec (MPICH/Intel MPI)", "MPI_LOCALRANKID", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
     "mpiexec -genv MASTER_ADDR <first host> -genv MASTER_PORT <port>"),
    ("mpiexec (Cray PALS)", "PMI_LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE",
     "mpiexec --env MASTER_ADDR=<first host> --env MASTER_PORT=<port>"),
)


def _mpi(environ, name: str, rank: str, size: str, local_rank: str, local_size: str, give: str) -> Rendezvous:
    world, local = _count(environ, size), _count(environ, local_size, environ[size])
    if world % local:
        raise RendezvousError(f"{name}: {local_size}={local} does not divide {size}={world}: the nodes run different "
                              "numbers of processes; start the same number per node (e.g. mpirun --map-by ppr:N:node)")
    nodes = world // local
    if nodes > 1 and "MASTER_ADDR" not in environ:
        raise RendezvousError(f"started by {name} with {world} processes on {nodes} nodes, but MASTER_ADDR is not "
                              f"set; run {give} ...")
    r = _rank(environ, rank, size, world)
    return Rendezvous(name, r, _int(environ, local_rank, "0"), world, local, nodes, r // local,
                      environ.get("MASTER_ADDR", "127.0.0.1"), environ.get("MASTER_PORT", DEFAULT_PORT))


def tasks_per_node(spec: str) -> list[int]:
    """Slurm's SLURM_TASKS_PER_NODE ("2(x3),1") as one count per node ([2, 2, 2, 1])."""
    counts = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise RendezvousError(f"SLURM_TASKS_PER_NODE={spec!r} is not in Slurm's format")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def uniform_tasks_per_node(counts: list[int], who: str, variable: str, spec: str | None,
                           fix: str = "submit with --ntasks-per-node") -> None:
    """Every node runs the same number of tasks, or one line saying how they differ and the fix."""
    if len(set(counts)) > 1:
        raise RendezvousError(f"{who} {counts} tasks on its {len(counts)} nodes ({variable}={spec}); every node needs "
                              f"the same number: {fix}")


def _srun(environ) -> Rendezvous:
    world, nodes = _count(environ, "SLURM_STEP_NUM_TASKS"), _count(environ, "SLURM_STEP_NUM_NODES", "1")
    variable = next((v for v in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if v in environ), None)
    per_node = tasks_per_node(environ[variable] if variable else str(world))
    uniform_tasks_per_node(per_node, "srun started", variable, variable and environ[variable])
    if "MASTER_ADDR" in environ:
        addr = environ["MASTER_ADDR"]
    else:
        nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise RendezvousError("srun did not set SLURM_STEP_NODELIST; set MASTER_ADDR to the first node's address")
        addr = node_address(hostnames(nodelist)[0])
    port = environ.get("MASTER_PORT") or str(job_port(environ))
    return Rendezvous("srun", _rank(environ, "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", world),
                      _int(environ, "SLURM_LOCALID", "0"), world, per_node[0], nodes,
                      _int(environ, "SLURM_NODEID", "0"), addr, port)


def job_port(environ=os.environ) -> int:
    """A port every task of a Slurm job derives alike from the job id (20000-39999)."""
    return 20000 + _int(environ, "SLURM_JOB_ID", "0") % 20000


def hostnames(nodelist: str) -> list[str]:
    """Slurm's compressed host list ("n[1-3,7]") expanded by `scontrol show hostnames`."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        said = " ".join((getattr(e, "stderr", None) or "").split())  # scontrol's own reason, when it gave one
        raise RendezvousError(f"cannot expand the Slurm node list {nodelist!r} with scontrol ({said or e}); set "
                              "MASTER_ADDR to the first node's address") from None
    return out.stdout.split()


def node_address(name: str) -> str:
    """A node's address: its name when that resolves, else the NodeAddr Slurm knows it by."""
    try:
        socket.getaddrinfo(name, None)
        return name
    except OSError:
        pass
    try:
        out = subprocess.run(["scontrol", "show", "node", name], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        out = ""
    m = re.search(r"NodeAddr=(\S+)", out)
    if not m:
        raise RendezvousError(f"node {name} does not resolve and Slurm has no NodeAddr for it; set MASTER_ADDR")
    return m.group(1)


def describe(environ=os.environ) -> dict:
    """What `ptm launch env` prints: the detected launcher and torch's variables, or why there are none."""
    found = detect(environ)
    return {"launcher": None, "world_size": 1} if found is None else asdict(found)
