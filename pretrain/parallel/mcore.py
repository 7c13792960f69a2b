"""megatron-core on any device. megatron-core 0.16 assumes CUDA in three places that ptm touches; this
module is the only one that knows it:

* its tensor-parallel RNG tracker stores CUDA generator states -> on CPU, `CpuRNGStatesTracker` keeps
  CPU generator states instead, installed as megatron's global tracker so its own helpers use it too;
* weights are created on the current CUDA device -> ptm always asks for CPU initialisation
  (`use_cpu_initialization`, which also makes weights identical for every TP size) and moves the model;
* `gather_output=True` and sequence parallelism allocate on `torch.cuda.current_device()` -> ptm's
  model never gathers outputs (losses are vocab-parallel) and does not use sequence parallelism on CPU.
"""
from __future__ import annotations

import contextlib
import os
import socket
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel
from megatron.core.model_parallel_config import ModelParallelConfig
from megatron.core.tensor_parallel import random as mrandom

from launchers import rendezvous
from pretrain import device as dev
from pretrain import heartbeat

MODEL_PARALLEL_RNG = "model-parallel-rng"


class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
    """megatron's RNG tracker, keeping CPU generator states."""

    def add(self, name, seed):
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        self.seeds_.add(seed)
        if name in self.states_:
            raise Exception(f"rng state {name} already exists")
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name=MODEL_PARALLEL_RNG):
        if name not in self.states_:
            raise Exception(f"rng state {name} is not added")
        original = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(original)


def rng_tracker():
    return tensor_parallel.get_cuda_rng_tracker()


def seed_everything(seed: int) -> None:
    """megatron's seeding: the default generator gets `seed` on every TP rank (dropout outside TP regions
    must agree), the model-parallel tracker `seed + 2718 + tp_rank` (dropout on partitioned heads)."""
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
        return
    mrandom._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    mrandom._CUDA_RNG_STATE_TRACKER.add(MODEL_PARALLEL_RNG, seed + 2718 + ps.get_tensor_model_parallel_rank())


def launched_world_size() -> int:
    """How many processes the launcher started (1 without one), before any process group exists."""
    if dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ["WORLD_SIZE"]) if rendezvous.export() else 1


def _rendezvous(timeout: timedelta):
    """torch's env:// rendezvous (store, rank, world); a master port taken by another process is one line (rank 0
    cannot listen on it), not a lost contact."""
    try:
        return next(dist.rendezvous("env://", timeout=timeout))
    except dist.DistNetworkError as e:
        if "EADDRINUSE" not in str(e):
            raise
        raise rendezvous.RendezvousError(
            f"MASTER_PORT {os.environ.get('MASTER_PORT')} is in use on {socket.gethostname()}: set MASTER_PORT to a "
            "free port (mpirun -x MASTER_PORT=..., torchrun --master_port ...)") from None


def attempt_store(store: dist.Store) -> dist.Store:
    """The rendezvous store as this start sees it: torchrun's agent keeps its store across --max-restarts attempts
    (torch 2.13), so each attempt's keys (heartbeat verdicts, the GPU census, the process group's) go under a prefix
    of their own, or restarted ranks would read the previous attempt's."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return store  # (rank 0's own, new every start)
    return dist.PrefixStore(f"ptm/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def check_even_nodes(store: dist.Store, world: int, local_size: int, launcher: str) -> None:
    """Every node runs as many ranks, or every rank stops with one line: a rank of mpirun or torchrun sees only its
    own node's count (LOCAL_WORLD_SIZE), so each counts itself under it in the rendezvous `store`."""
    prefix = "ptm/nodes"
    if store.add(f"{prefix}/{local_size}", 1) == 1:  # the first rank with this count lists it
        store.set(f"{prefix}/size{store.add(f'{prefix}/sizes', 1)}", str(local_size))
    dev.arrive(store, f"{prefix}/posted", world)
    listed = range(1, store.add(f"{prefix}/sizes", 0) + 1)
    sizes = sorted((int(v) for v in store.multi_get([f"{prefix}/size{i}" for i in listed])), reverse=True)
    counts = [s for s in sizes for _ in range(-(-store.add(f"{prefix}/{s}", 0) // s))]
    rendezvous.uniform_tasks_per_node(counts, f"{launcher} started", "LOCAL_WORLD_SIZE", " and ".join(map(str, sizes)),
                                      "start as many on each (torchrun --nproc-per-node, mpirun --map-by ppr:N:node, "
                                      "srun --ntasks-per-node)")


def init_processes(timeout_s: int = 600, collective_timeout_s: float | None = None) -> int:
    """The process group, from the launcher's environment (torchrun, deepspeed, mpirun, srun) or a
    one-process group without a launcher; returns the world size. Reaching the master gives up after
    `timeout_s`, a collective after `collective_timeout_s` (default the same; it and NCCL's error handling
    are chosen in pretrain/heartbeat.py, whose verdicts must come first). On CUDA the group is bound to this
    process's GPU (`device_id`, after `dev.bind`), once the ranks of each node have shown that their GPUs
    differ (NCCL binds at once)."""
    if not dist.is_initialized():
        kind = rendezvous.export()
        os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed asks for the launcher's LOCAL_RANK
        options = {"timeout": timedelta(seconds=timeout_s)}
        if torch.cuda.is_available():
            options["device_id"] = dev.bind()
            for name, value in heartbeat.NCCL_ENV.items():
                os.environ.setdefault(name, value)
        else:  # megatron-core's advice on a CUDA setting (for TP's overlap on GPUs): noise without CUDA
            warnings.filterwarnings("ignore", message=".*CUDA_DEVICE_MAX_CONNECTIONS")
        if kind:
            store, rank, world = _rendezvous(options["timeout"])
            store = attempt_store(store)
            check_even_nodes(store, world, int(os.environ["LOCAL_WORLD_SIZE"]), kind)
            dev.check_unshared(store, rank, world)
            dist.init_process_group(dev.backend(), store=dist.PrefixStore("default_pg", store), rank=rank,
                                    world_size=world, **options)
        else:
            dist.init_process_group(dev.backend(), store=dist.HashStore(), rank=0, world_size=1, **options)
        if collective_timeout_s:
            dist.distributed_c10d._set_pg_timeout(timedelta(seconds=collective_timeout_s))
    return dist.get_world_size()


def initialize(tp: int = 1, seed: int = 1234, timeout_s: int = 600, collective_timeout_s: float | None = None) -> None:
    """Process groups (see `init_processes`) and megatron-core's TP x DP groups, then the seeds."""
    init_processes(timeout_s, collective_timeout_s)
    if ps.model_parallel_is_initialized() and tp_size() != tp:
        ps.destroy_model_parallel()
    if not ps.model_parallel_is_initialized():  # groups (and their threads) are made once per TP size
        ps.initialize_model_parallel(tensor_model_parallel_size=tp,
                                     distributed_timeout_minutes=(collective_timeout_s or timeout_s) / 60)
    seed_everything(seed)


def shutdown() -> None:
    """Stop the heartbeat, destroy megatron-core's groups and the process group (NCCL warns at exit otherwise)."""
    heartbeat.stop()
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


class OneRank:
    """A stand-in tensor-parallel group of one rank, for a model built outside a run (conversion, counting): building
    needs no process group; megatron-core's layers and mappings ask a group only its size and rank and skip every
    communication at size 1. Running one needs torch.distributed initialized all the same (megatron-core 0.16's
    mappings drop any group without it): `init_processes()` makes a one-process group."""

    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


def model_parallel_config(group=None, params_dtype: torch.dtype = torch.float32) -> ModelParallelConfig:
    """megatron-core's layer settings for TP `group` (default: the run's)."""
    group = group or tp_group()
    return ModelParallelConfig(
        tensor_model_parallel_size=group.size(),
        use_cpu_initialization=True,
        perform_initialization=True,
        params_dtype=params_dtype,
    )


def tp_group():
    """The run's tensor-parallel group; a group of one rank before megatron-core's groups exist."""
    return ps.get_tensor_model_parallel_group() if ps.model_parallel_is_initialized() else OneRank()


def tp_rank() -> int:
    return ps.get_tensor_model_parallel_rank()


def tp_size() -> int:
    return ps.get_tensor_model_parallel_world_size()


class DeepSpeedMPU:
    """megatron-core's parallel_state under the names DeepSpeed's `mpu=` argument expects: DeepSpeed asks
    for the "model parallel" rank/size/group (here: tensor parallel) and the data-parallel ones."""

    get_model_parallel_rank = staticmethod(ps.get_tensor_model_parallel_rank)
    get_model_parallel_world_size = staticmethod(ps.get_tensor_model_parallel_world_size)
    get_model_parallel_group = staticmethod(ps.get_tensor_model_parallel_group)
    get_tensor_model_parallel_rank = staticmethod(ps.get_tensor_model_parallel_rank)
    get_tensor_model_parallel_world_size = staticmethod(ps.get_tensor_model_parallel_world_size)
    get_tensor_model_parallel_group = staticmethod(ps.get_tensor_model_parallel_group)
    get_tensor_model_parallel_src_rank = staticmethod(ps.get_tensor_model_parallel_src_rank)
    get_data_parallel_rank = staticmethod(ps.get_data_parallel_rank)
    get_data_parallel_world_size = staticmethod(ps.get_data_parallel_world_size)
    get_data_parallel_group = staticmethod(ps.get_data_parallel_group)
    get_pipeline_model_parallel_rank = staticmethod(ps.get_pipeline_model_parallel_rank)
    get_pipeline_model_parallel_world_size = staticmethod(ps.get_pipeline_model_parallel_world_size)
    get_pipeline_model_parallel_group = staticmethod(ps.get_pipeline_model_parallel_group)


def dp_group():
    return ps.get_data_parallel_group()


def dp_rank() -> int:
    return ps.get_data_parallel_rank()


def dp_size() -> int:
    return ps.get_data_parallel_world_size()
