"""The one device abstraction: CUDA with NCCL when there is a GPU, else CPU with gloo."""
from __future__ import annotations

import contextlib
import json
import os
import re
import socket

import torch
import torch.distributed as dist


class DeviceError(RuntimeError):
    """A process/device mismatch; the message names the variable and the fix."""


def memory_ran_out(e: BaseException) -> str | None:
    """What ran out, for a device that ran out of memory (torch.OutOfMemoryError on a GPU; the CPU allocator's error,
    or MemoryError); None for any other failure."""
    if isinstance(e, torch.OutOfMemoryError):
        asked = re.search(r"Tried to allocate ([\d.]+ \w+)", str(e))
        return f"the GPU ran out of memory ({f'tried to allocate {asked[1]}' if asked else str(e).splitlines()[0]})"
    if isinstance(e, RuntimeError) and (asked := re.search(r"can't allocate memory: you tried to allocate (\d+)",
                                                           str(e))):
        return f"host memory ran out (tried to allocate {int(asked[1]) / 2**30:.2f} GiB)"
    return "host memory ran out" if isinstance(e, MemoryError) else None


BUILDING = "ptm: ran out building the model and its optimizer states"  # the note `building` adds


@contextlib.contextmanager
def building():
    """Memory that runs out in here ran out holding the model's states (weights, gradients, optimizer states), not a
    micro batch's activations: `out_of_memory` names other fixes."""
    try:
        yield
    except BaseException as e:
        if memory_ran_out(e):
            e.__notes__ = [*getattr(e, "__notes__", ()), BUILDING]  # (BaseException.add_note: Python 3.11 on)
        raise


def out_of_memory(e: BaseException, steps: int) -> str | None:
    """What to do about a device that ran out of memory (`memory_ran_out`), `steps` steps into the run; None for any
    other failure."""
    what = memory_ran_out(e)
    if what is None:
        return None
    if BUILDING in getattr(e, "__notes__", ()):
        return (f"{what} building the model and its optimizer states: they do not fit; partition them (raise "
                "zero.stage: 3 splits the weights too; or parallel.tp; or zero.offload=true) or train a smaller "
                "model (model.hidden_size, model.num_layers); `ptm plan` shows the memory by component")
    return (f"{what} {f'after {steps} steps' if steps else 'before the first step'}: lower train.micro_batch_size "
            "(gradient accumulation keeps the global batch) or set it to auto (the largest `ptm plan` fits), or set "
            "model.activation_checkpointing=true; then re-run to resume from the last checkpoint")


def device() -> torch.device:
    """This process's device: cpu without CUDA, else cuda:(LOCAL_RANK mod the number of GPUs it sees).

    LOCAL_RANK numbers the processes of a node (launchers/rendezvous.py fills it in for every launcher, srun's
    SLURM_LOCALID included). Processes that see the same GPUs (a launcher's inside one Slurm task, srun's tasks
    without GPU binding) take one each in that order; a process that sees only GPUs of its own (srun
    --gpus-per-task=1, a MIG slice, CUDA_VISIBLE_DEVICES set per process) takes one of those. More processes than
    GPUs would share one: `check_unshared` refuses that at start-up, naming the ranks."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())


def bind() -> torch.device:
    """Make this process's GPU current, and DeepSpeed's: it takes LOCAL_RANK as the CUDA device index (its engine,
    ZeRO-3's parameter partitioning) and checks it against Open MPI's local rank, so a process that sees only GPUs of
    its own gets both set to its index."""
    gpu = device()
    if str(gpu.index) != os.environ.get("LOCAL_RANK", "0"):
        for name in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"):
            if name in os.environ:
                os.environ[name] = str(gpu.index)
    torch.cuda.set_device(gpu)
    return gpu


def check_unshared(store: dist.Store, rank: int, world: int) -> None:
    """Refuse two ranks of one node on one GPU, before NCCL binds them (it would fail later, less clearly): every rank
    posts its GPU's UUID (a MIG slice's own) to the rendezvous `store` and reads its node's. Every rank raises the
    same DeviceError, naming both ranks, the host and the fix."""
    if world == 1 or not torch.cuda.is_available():
        return
    host, index, visible = socket.gethostname(), torch.cuda.current_device(), os.environ.get("CUDA_VISIBLE_DEVICES")
    prefix = "ptm/gpus"  # (`store`: this start's own, torchrun's restarts included: mcore.attempt_store)
    mine = [rank, str(torch.cuda.get_device_properties(index).uuid), index, visible or "unset"]
    store.set(f"{prefix}/{host}/{store.add(f'{prefix}/{host}/n', 1)}", json.dumps(mine))
    arrive(store, f"{prefix}/posted", world)
    node = store.multi_get([f"{prefix}/{host}/{i}" for i in range(1, store.add(f"{prefix}/{host}/n", 0) + 1)])
    problem = _shared(host, sorted(json.loads(v) for v in node))
    if problem:
        store.set(f"{prefix}/problem", problem)
    arrive(store, f"{prefix}/checked", world)
    if store.check([f"{prefix}/problem"]):
        raise DeviceError(store.get(f"{prefix}/problem").decode())


def _shared(host: str, node: list) -> str | None:
    """The first two of a node's ranks ([rank, GPU UUID, index, CUDA_VISIBLE_DEVICES], by rank) on one GPU."""
    seen = {}
    for rank, gpu, index, visible in node:
        if gpu in seen:
            first, first_index, first_visible = seen[gpu]
            return (f"ranks {first} and {rank} on {host} both use GPU {gpu} (as cuda:{first_index} and cuda:{index}, "
                    f"CUDA_VISIBLE_DEVICES={first_visible} and {visible}): start one process per GPU, e.g. srun "
                    "--gpus-per-task=1 with a task per GPU, or one task that sees the node's N GPUs "
                    "(--gpus-per-node=N) running torchrun --nproc_per_node=N; a process sees one MIG slice: give each "
                    "its own CUDA_VISIBLE_DEVICES=MIG-...")
        seen[gpu] = rank, index, visible
    return None


def arrive(store: dist.Store, key: str, world: int) -> None:
    """Wait in `store` until all `world` ranks have arrived at `key`."""
    if store.add(key, 1) == world:
        store.set(f"{key}/all", "1")
    store.wait([f"{key}/all"])


def backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def all_reduce(tensor: torch.Tensor, group=None, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """All-reduce `tensor` in place over `group` on the communication device: NCCL takes only CUDA tensors,
    so a CPU tensor (offloaded optimizer state, metrics) travels through the GPU and back."""
    if dist.get_world_size(group) == 1:
        return tensor
    comm = device() if backend() == "nccl" else torch.device("cpu")
    moved = tensor.to(comm)
    dist.all_reduce(moved, op=op, group=group)
    if moved is not tensor:
        tensor.copy_(moved)
    return tensor


def rank0s(answer):
    """`answer()` as rank 0 computes it, on every rank (one broadcast; the other ranks do not call it)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return answer()
    box = [answer() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def check_precision(precision: str) -> None:
    """bf16 on a GPU without native bf16 (compute capability < 8.0, e.g. V100) is emulated and very slow."""
    if precision == "bf16" and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        if major < 8:
            raise DeviceError(f"precision=bf16 needs native bf16 (compute capability 8.0+), but "
                              f"{torch.cuda.get_device_name()} is {major}.{minor}; use precision=fp16")


def rng_state() -> dict:
    """The torch RNG states of this process (CPU, and the current GPU if any)."""
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def deterministic(on: bool) -> None:
    """Deterministic kernels (cuBLAS workspace, no nondeterministic embedding/attention backward on CUDA), for
    bit-identical resumes on GPUs; CPU kernels are deterministic already."""
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(on, warn_only=False)


def peak_memory_gib() -> float:
    """Peak memory of this process: GPU memory allocated by torch on CUDA, else the peak resident set size."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2 ** 30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux


def capacity_gib() -> float:
    """The memory one rank may fill, the smallest over all ranks (they pick one micro batch together): its GPU's
    whole memory, or on a CPU the machine's physical memory shared by the node's processes (LOCAL_WORLD_SIZE)."""
    if torch.cuda.is_available():
        total = torch.cuda.get_device_properties(device()).total_memory
    else:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if dist.is_initialized():
        total = int(all_reduce(torch.tensor([total], dtype=torch.int64), op=dist.ReduceOp.MIN).item())
    return total / 2 ** 30


def device_memory() -> dict[str, float]:
    """On a GPU, `device_memory_gib`: all of its memory in use now as the driver counts it (what torch's allocator
    holds, cached blocks included, plus the CUDA context, NCCL's buffers and other processes); nothing on a CPU."""
    if not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info()
    return {"device_memory_gib": (total - free) / 2 ** 30}
