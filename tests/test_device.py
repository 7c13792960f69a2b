"""The device choices of the CUDA path, run on CPU with torch.cuda's answers replaced (no GPU here): the GPU each rank
takes for every launcher x Slurm GPU binding, two ranks on one GPU refused at start-up, bf16 without native bf16, MFU
on a MIG slice, the device's memory in use."""
from __future__ import annotations

import json
import os
import socket
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import free_port
from launchers import rendezvous
from pretrain import device as dev
from pretrain import hardware

LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "GROUP_RANK", "NODE_RANK",
                      "CROSS_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")


def gpus(monkeypatch, count: int, capability=(8, 0), name="NVIDIA A100-SXM4-80GB", uuids=None):
    """A node whose process sees `count` GPUs, cuda:i with UUID `uuids[i]` (default GPU-i). `monkeypatch` None: for
    the rest of the process (a spawned rank's)."""
    current, uuids = [0], uuids or [f"GPU-{i}" for i in range(count)]
    patch = monkeypatch.setattr if monkeypatch else setattr
    patch(torch.cuda, "is_available", lambda: True)
    patch(torch.cuda, "device_count", lambda: count)
    patch(torch.cuda, "get_device_capability", lambda *a: capability)
    patch(torch.cuda, "get_device_name", lambda *a: name)
    patch(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(name=name, uuid=uuids[i]))
    patch(torch.cuda, "set_device", lambda d: current.__setitem__(0, torch.device(d).index))
    patch(torch.cuda, "current_device", lambda: current[0])


def srun(task: int, tasks: int, **slurm) -> dict:
    """A task srun started, one of `tasks` on one node."""
    return {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(task), "SLURM_LOCALID": str(task),
            "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": str(tasks),
            "MASTER_ADDR": "10.0.0.1", **slurm}


ALL8 = "0,1,2,3,4,5,6,7"
BATCH8 = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1",
          "SLURM_GPUS_PER_TASK": "8"}  # sbatch --ntasks-per-node=1 --gpus-per-task=8: the batch script's task
MATRIX = {  # launcher x Slurm GPU binding: (environment, GPUs the process sees, the index it must take)
    "srun --gpus-per-task=1: each task sees its own GPU": (
        srun(5, 8, SLURM_GPUS_PER_TASK="1", CUDA_VISIBLE_DEVICES="5"), 1, 0),
    "srun --gpus-per-task=1, devices confined by cgroups": (srun(5, 8, SLURM_GPUS_PER_TASK="1"), 1, 0),
    "srun --gpus-per-node=8: every task sees the node's GPUs": (
        srun(6, 8, SLURM_GPUS_PER_NODE="8", CUDA_VISIBLE_DEVICES=ALL8), 8, 6),
    "--gpus-per-task=8, torchrun starting 8 ranks in the task": (
        {**srun(0, 1, SLURM_GPUS_PER_TASK="8", CUDA_VISIBLE_DEVICES=ALL8), "RANK": "5", "LOCAL_RANK": "5",
         "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "0"}, 8, 5),
    "--gpus-per-task=8, the deepspeed launcher in the batch script": (
        {**BATCH8, "RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "LOCAL_SIZE": "8", "CROSS_RANK": "0",
         "CUDA_VISIBLE_DEVICES": ALL8}, 8, 3),
    "--gpus-per-task=8, mpirun in the batch script": (
        {**BATCH8, "OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "6",
         "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}, 8, 6),
    "--gpus-per-node=8 on 2 nodes, torchrun on the second": (
        {"SLURM_JOB_ID": "7", "SLURM_GPUS_PER_NODE": "8", "RANK": "13", "LOCAL_RANK": "5", "WORLD_SIZE": "16",
         "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1"}, 8, 5),
    "mpiexec (MPICH) on a node of 4 GPUs": (
        {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"}, 4, 2),
    "mpirun, CUDA_VISIBLE_DEVICES set per rank by a wrapper": (
        {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
         "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "CUDA_VISIBLE_DEVICES": "3"}, 1, 0),
    "MIG: srun tasks given a slice each": (srun(4, 7, CUDA_VISIBLE_DEVICES="MIG-4f1c8e2a-0b7d-5e3f-9a61-2c8d7e5b4a90"),
                                           1, 0),
    "one process, no launcher": ({}, 8, 0),
}


@pytest.mark.parametrize("case", MATRIX)
def test_each_rank_takes_its_gpu_under_every_launcher_and_slurm_binding(monkeypatch, case):
    """What init_processes does: the launcher's variables become torch's, then `bind` picks the GPU and leaves its
    index in LOCAL_RANK (and Open MPI's), where DeepSpeed's engine and ZeRO-3 take the device from."""
    env, count, index = MATRIX[case]
    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_", "PMI_", "MPI_LOCAL", "MV2_")) or name in LAUNCHER_VARIABLES:
            monkeypatch.delenv(name)
    env = dict(env)
    rendezvous.export(env)
    env.setdefault("LOCAL_RANK", "0")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    gpus(monkeypatch, count)
    assert dev.bind() == dev.device() == torch.device("cuda", index)
    assert torch.cuda.current_device() == index and os.environ["LOCAL_RANK"] == str(index)
    assert os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", str(index)) == str(index)  # DeepSpeed asserts they agree


def _post(rank: int, ports: tuple[int, int], out: str) -> None:
    """One of two ranks that torchrun started on a node, at start-up: `check_unshared` twice (a fresh store each time),
    first on a GPU of its own (UUID GPU-rank), then on the one GPU both ranks see (GPU-a); then the run's start,
    `init_processes`, on GPU-a: what each said, and whether a process group exists after the start."""
    from pretrain.parallel import mcore

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports[1]), CUDA_VISIBLE_DEVICES="0")
    store = dist.TCPStore("127.0.0.1", ports[0], 2, is_master=rank == 0, timeout=timedelta(seconds=60))
    answers = []
    for start, uuid in enumerate([f"GPU-{rank}", "GPU-a"]):
        gpus(None, 1, uuids=[uuid])
        try:
            dev.check_unshared(dist.PrefixStore(f"start{start}", store), rank, 2)
            answers.append("ok")
        except dev.DeviceError as e:
            answers.append(str(e))
    try:
        mcore.init_processes(timeout_s=60)
        answers.append("started")
    except Exception as e:  # a DeviceError, or what a start without the check raises (NCCL is not built here)
        error = e  # noqa: F841  its frames hold the rendezvous store (rank 0's): kept until the other rank is done
        answers.append(f"{type(e).__name__}: {e}")
    answers.append(dist.is_initialized())
    with open(os.path.join(out, f"answers{rank}.json"), "w") as f:
        json.dump(answers, f)
    if rank == 0:
        store.wait(["done"])  # the master's stores outlive the other rank's reads
    else:
        store.set("done", "1")


@pytest.fixture(scope="module")
def node_start(tmp_path_factory):
    """Both ranks' answers (`_post`), by rank."""
    out, ports = tmp_path_factory.mktemp("start"), (free_port(), free_port())
    while ports[1] == ports[0]:
        ports = ports[0], free_port()
    mp.start_processes(_post, args=(ports, str(out)), nprocs=2, start_method="spawn")
    return [json.load(open(out / f"answers{r}.json")) for r in range(2)]


def test_two_ranks_on_one_gpu_are_refused_in_one_line_naming_both(node_start):
    (distinct, shared, _, _), again = node_start
    assert distinct == again[0] == "ok"
    assert shared == again[1], (shared, again[1])  # every rank stops, saying the same
    assert shared.startswith(f"ranks 0 and 1 on {socket.gethostname()} both use GPU GPU-a (as cuda:0 and cuda:0, "
                             "CUDA_VISIBLE_DEVICES=0 and 0): start one process per GPU")
    assert "srun --gpus-per-task=1" in shared and "MIG" in shared and "\n" not in shared


def test_the_run_s_start_refuses_two_ranks_on_one_gpu_before_any_process_group(node_start):
    """The check is part of the start: `init_processes` raises that DeviceError on both ranks, out of the rendezvous,
    before a process group exists (NCCL's would bind both ranks to the one GPU)."""
    for _, shared, started, grouped in node_start:
        assert started == f"DeviceError: {shared}" and not grouped, started


def test_bf16_without_native_bf16_is_refused(monkeypatch):
    gpus(monkeypatch, 8, capability=(7, 0), name="Tesla V100-SXM2-32GB")
    with pytest.raises(dev.DeviceError, match="Tesla V100-SXM2-32GB is 7.0; use precision=fp16"):
        dev.check_precision("bf16")
    dev.check_precision("fp16")
    gpus(monkeypatch, 8, capability=(9, 0), name="NVIDIA H100 80GB HBM3")
    dev.check_precision("bf16")


def test_mfu_on_a_mig_slice_is_against_the_slice_s_share_of_the_peak(monkeypatch):
    gpus(monkeypatch, 1, name="NVIDIA A100-SXM4-80GB MIG 3g.40gb")
    assert hardware.mfu(312e12 * 3 / 7 / 2, torch.cuda.get_device_name(), "bf16") == pytest.approx(0.5)  # (trainer's)
    assert hardware.peak_flops("NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb", "bf16") == pytest.approx(989e12 / 7)
    assert hardware.peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == 312e12 and hardware.mig_share("NVIDIA H200") == 1


def test_device_memory_is_what_the_driver_counts_in_use_beside_torch_s_peak(monkeypatch):
    assert dev.device_memory() == {}  # a CPU: its peak resident set is memory_gib already
    gpus(monkeypatch, 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (30 * 2 ** 30, 80 * 2 ** 30))  # (free, total)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 12 * 2 ** 30)
    assert dev.device_memory() == {"device_memory_gib": 50.0} and dev.peak_memory_gib() == 12.0
