"""The device checks of the CUDA path, run on CPU with torch.cuda's answers replaced (no GPU here): more ranks than
GPUs, bf16 without native bf16."""
import pytest
import torch

from pretrain import device as dev


def gpus(monkeypatch, count: int, capability=(8, 0), name="NVIDIA A100-SXM4-80GB"):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)


def test_local_rank_picks_its_gpu_and_more_ranks_than_gpus_is_refused(monkeypatch):
    gpus(monkeypatch, 4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert dev.device() == torch.device("cuda", 3)
    monkeypatch.setenv("LOCAL_RANK", "4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    with pytest.raises(dev.DeviceError) as e:
        dev.device()
    message = str(e.value)
    assert "LOCAL_RANK=4" in message and "4 visible GPU(s)" in message and "CUDA_VISIBLE_DEVICES=0,1,2,3" in message
    assert "\n" not in message
    monkeypatch.setenv("LOCAL_RANK", "3")  # srun --gpus-per-task=1: each task sees its own GPU only
    gpus(monkeypatch, 1)
    monkeypatch.setenv("SLURM_GPUS_PER_TASK", "1")
    assert dev.device() == torch.device("cuda", 0)


def test_bf16_without_native_bf16_is_refused(monkeypatch):
    gpus(monkeypatch, 8, capability=(7, 0), name="Tesla V100-SXM2-32GB")
    with pytest.raises(dev.DeviceError, match="Tesla V100-SXM2-32GB is 7.0; use precision=fp16"):
        dev.check_precision("bf16")
    dev.check_precision("fp16")
    gpus(monkeypatch, 8, capability=(9, 0), name="NVIDIA H100 80GB HBM3")
    dev.check_precision("bf16")

