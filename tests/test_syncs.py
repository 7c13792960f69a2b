"""Host synchronisations per optimizer step (issue 21, defect 4): on a GPU, each one makes the CPU wait for the device
to drain its queue, so it cannot run ahead. ptm's own code makes none per micro-batch and one per step (the step's
metrics and flags, with the previous step's gradient norm, in one transfer before the optimizer runs:
`Trainer.train_step`), and DeepSpeed's step a fixed number of its own, for every objective, 1 or 4 micro-batches,
padded or packed batches.

What counts, since on the CPU nothing waits: the calls that make a CPU wait for a GPU.
* `aten._local_scalar_dense` (`.item()`, `float(t)`, `bool(t)`, `if t:`), `aten.is_nonzero`, `aten.equal`: a value to
  the host.
* ops whose output shape is data: `nonzero`, `masked_select`, `unique*`, `repeat_interleave` without `output_size`,
  and indexing (`index`, `index_put`) with a boolean mask, which torch turns into `nonzero`; except `index_put` of a
  single value, which torch runs as `masked_fill` (megatron-core's `target[mask] = 0`).
* `Tensor.tolist`, `.cpu`, `.numpy`, `__array__`: a copy to the host. On CPU they dispatch no aten op when the tensor
  is already there, so a TorchFunctionMode counts them.
* DeepSpeed's accelerator `synchronize()` (a device-wide sync on a GPU, a no-op on CPU): its calls are counted.
* `aten.lift_fresh`: a tensor made from Python data (`torch.tensor(x)`, `t.new_tensor(x)`); on a GPU its blocking copy
  from pageable memory synchronises the stream (`torch.full` / `new_full` do not).
Not counted: `.to(device, non_blocking=True)` of the loader's batches (pinned on a GPU), and the loader's work (collate,
packing, `Objective.locate`'s indices), done on host tensors in its worker processes (`data.num_workers=1` here).
A sync belongs to DeepSpeed when the innermost ptm or DeepSpeed frame of its stack is DeepSpeed's; none happens in
the backward pass (a model's or a DeepSpeed hook's).
"""
from __future__ import annotations

import collections
import gc
import json
import os
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import ROOT
from deepspeed.accelerator import get_accelerator
from pretrain.config import load

PTM = os.path.join(ROOT, "pretrain") + os.sep
SCALAR = {"_local_scalar_dense", "is_nonzero", "equal", "lift_fresh"}
SHAPED = {"nonzero", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive",
          "unique_dim_consecutive"}
TO_HOST = {"tolist", "cpu", "numpy", "__array__"}
# per step, DeepSpeed 0.19.8 (gradient clipping, ptm's two parameter groups: docs/performance.md names each)
EXPECTED = {"zero.stage=1": {"ptm": 1, "deepspeed": 5}, "zero.stage=0": {"ptm": 1, "deepspeed": 2},
            "precision=bf16": {"ptm": 1, "deepspeed": 2}, "zero.stage=3": {"ptm": 1, "deepspeed": 3},
            "fused_lm_loss=on": {"ptm": 1, "deepspeed": 5}}
ERNIE_TASKS = {"knowledge_masking": 1, "capitalization": 1, "sentence_reordering": 1, "sentence_distance": 1}
ERNIE_STAGE = "ernie.stages=" + json.dumps([{"steps": 5, "tasks": ERNIE_TASKS}])
PRESETS = {"mlm_nsp": ["bert-tiny"], "mlm_sop": ["albert-tiny"], "clm": ["gpt2-tiny"], "electra": ["electra-tiny"],
           "mlm": ["roberta-tiny", "model.max_position_embeddings=34", "train.grad_clip=1.0"],  # (RoBERTa's own
           # recipe does not clip: DeepSpeed then computes no norm, two syncs fewer)
           "ernie": ["ernie-tiny", ERNIE_STAGE],
           "unilm": ["unilm-tiny"], "plm": ["xlnet-tiny", "model.mem_len=24", "model.reuse_len=16", "xlnet.perm_size=16"],
           "clm, a memory": ["transfo-xl-tiny", "model.mem_len=32"]}  # each stream's memory read and kept on the device


def _owner() -> str:
    """Whose code asked: "backward" inside the backward pass (the Python stack there is the caller of `backward`),
    else the innermost ptm or DeepSpeed frame of the stack."""
    if torch._C._current_autograd_node() is not None:
        return "backward"
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(PTM):
            return "ptm"
        if f"{os.sep}deepspeed{os.sep}" in path:
            return "deepspeed"
        frame = frame.f_back
    return "other"


def _forces_sync(func, args, kwargs) -> bool:
    name = func.overloadpacket.__name__
    if name in SCALAR or name in SHAPED:
        return True
    if name in ("index", "index_put", "index_put_"):
        masks = any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)
        return masks and not (name != "index" and args[2].numel() == 1)
    return name == "repeat_interleave" and isinstance(args[0], torch.Tensor) and len(args) < 3 \
        and kwargs.get("output_size") is None


class Syncs(TorchDispatchMode):
    """Counts the aten ops that force a host sync on a GPU, by owner (`seen`), with the op names (`ops`)."""

    def __init__(self):
        super().__init__()
        self.seen, self.ops = collections.Counter(), collections.Counter()
        self.setting = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _forces_sync(func, args, kwargs) and not (self.setting and func is torch.ops.aten.lift_fresh.default):
            self.seen[_owner()] += 1
            self.ops[f"{_owner()}: {func}"] += 1
        return func(*args, **kwargs)


class Transfers(TorchFunctionMode):
    """Counts copies to the host that dispatch nothing on CPU, into `syncs`."""

    def __init__(self, syncs: Syncs):
        super().__init__()
        self.syncs = syncs

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in TO_HOST:
            self.syncs.seen[_owner()] += 1
            self.syncs.ops[f"{_owner()}: Tensor.{name}"] += 1
        if name != "__setitem__":
            return func(*args, **(kwargs or {}))
        self.syncs.setting += 1  # `t[i] = 0` wraps the 0 in a host tensor (lift_fresh): never copied to a GPU
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.syncs.setting -= 1


def _per_step(train_data, tmp_path, objective: str, accumulation: int, *more: str) -> list[dict]:
    """The syncs (by owner) and the ops behind them from the start of each of the optimizer steps 3 and 4 of `fit` to
    that of the next (the first two include the loop's start and DeepSpeed's first step)."""
    from pretrain.train import Trainer

    preset, *options = PRESETS[objective]
    cfg = load(preset, [f"data.path={train_data}", f"out_dir={tmp_path}", "data.num_workers=1", "data.seq_len=32",
                        "model.max_position_embeddings=32", "train.steps=5", "train.micro_batch_size=2",
                        f"train.global_batch_size={2 * accumulation}", "optimizer.warmup_steps=1",
                        "train.log_interval=1", "train.eval_interval=0", "train.eval_steps=1", "checkpoint.interval=0",
                        "data.valid_fraction=0.02", *options, *more])
    trainer = Trainer(cfg)
    syncs, marks = Syncs(), []
    step = trainer.train_step

    def marked(micro):
        marks.append((collections.Counter(syncs.seen), collections.Counter(syncs.ops)))
        return step(micro)

    trainer.train_step = marked
    accelerator = get_accelerator()

    def synchronize(*args, **kwargs):
        syncs.seen[_owner()] += 1
        syncs.ops[f"{_owner()}: accelerator.synchronize"] += 1
        return type(accelerator).synchronize(accelerator, *args, **kwargs)
    accelerator.synchronize = synchronize
    gc.collect()  # an earlier test's engine, collected mid-step, would count its destroy()'s synchronize as this one's
    gc.disable()
    try:
        with syncs, Transfers(syncs):
            trainer.fit()
    finally:
        gc.enable()
        del accelerator.synchronize
        trainer.close()
    assert len(marks) == cfg.train.steps
    return [{"counts": dict(b[0] - a[0]), "ops": dict(b[1] - a[1])} for a, b in zip(marks[2:], marks[3:])]


@pytest.mark.parametrize("accumulation", [1, 4])
@pytest.mark.parametrize("objective", list(PRESETS))
def test_syncs_per_step_are_fixed_for_every_objective(train_data, tmp_path, objective, accumulation):
    """ZeRO-1 fp32 (the tiny presets): the same syncs per step with 1 or 4 micro-batches, two of them ptm's."""
    for step in _per_step(train_data, tmp_path, objective, accumulation):
        assert step["counts"] == EXPECTED["zero.stage=1"], step["ops"]


@pytest.mark.parametrize("objective, setting", [("mlm_nsp", "data.unpadded=true"), ("ernie", "data.unpadded=true"),
                                                ("mlm_nsp", "zero.stage=0"), ("mlm_nsp", "precision=bf16"),
                                                ("mlm_nsp", "zero.stage=3"), ("clm", "fused_lm_loss=on")])
def test_syncs_per_step_with_packed_batches_and_other_optimizers(train_data, tmp_path, objective, setting):
    """Packed batches pick their elements the same way; the fused LM loss (liger's kernel, interpreted) adds none;
    without ZeRO (fp32), with bf16 at ZeRO-1 (the base presets: 3 in all; BF16_Optimizer's clipping asks no question
    of the device under pretrain/parallel/multi_tensor.py) and at ZeRO-3 DeepSpeed's step makes fewer syncs of its
    own."""
    for step in _per_step(train_data, tmp_path, objective, 4, setting):
        assert step["counts"] == EXPECTED.get(setting, EXPECTED["zero.stage=1"]), step["ops"]
