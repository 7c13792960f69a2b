"""The one device abstraction: CUDA with NCCL when there is a GPU, else CPU with gloo."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist


class DeviceError(RuntimeError):
    """A process/device mismatch; the message names the variable and the fix."""


def device() -> torch.device:
    """This process's device: cuda:LOCAL_RANK when CUDA is available (CUDA_VISIBLE_DEVICES decides which GPUs
    that is; under srun --gpus-per-task each task sees only its own, cuda:0), else cpu. More ranks per node than
    visible GPUs is refused rather than sharing a GPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local, count = int(os.environ.get("LOCAL_RANK", 0)), torch.cuda.device_count()
    if os.environ.get("SLURM_GPUS_PER_TASK", "").isdigit() and count == int(os.environ["SLURM_GPUS_PER_TASK"]):
        return torch.device("cuda", 0)
    if local >= count:
        raise DeviceError(f"LOCAL_RANK={local} but this node has {count} visible GPU(s) "
                          f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); start at most "
                          f"{count} processes per node (--nproc_per_node / --ntasks-per-node / --gpus-per-node)")
    return torch.device("cuda", local)


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
