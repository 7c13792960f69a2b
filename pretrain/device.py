"""The one device abstraction: CUDA with NCCL when there is a GPU, else CPU with gloo."""
from __future__ import annotations

import os

import torch


def device() -> torch.device:
    """This process's device: cuda:LOCAL_RANK when CUDA is available, else cpu."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    return torch.device("cpu")


def backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


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


def peak_memory_gib() -> float:
    """Peak memory of this process: GPU memory allocated by torch on CUDA, else the peak resident set size."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2 ** 30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux
