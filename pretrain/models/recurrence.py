"""The memory of a recurrent model (Transformer-XL, XLNet: `model.mem_len`) from one training step to the next.

The data reads B streams (B: the global batch; `pretrain.data.gpt`, `indexes.stream_order`): step t of the global batch
holds step t of every stream, and stream k's samples all go to data-parallel rank k % dp (the sampler deals positions
round-robin, and B is a multiple of dp), under any micro-batch split. So each rank keeps the memories of its own
streams, stream k in slot k // dp, and a sample reads the memory its stream's previous step left: the slot's stamp
(stream, epoch, step) must be its own stream, epoch and step - 1, else the memory is masked out (a stream's first
step, a new epoch). Everything stays on the device: reading and writing index by the batch's stream field, the stamp
test is a mask, no host sync. The memory has mem_len slots per layer and a mask of those that hold a state, so the
model's shapes never change while a stream's first segments fill it.

Checkpoints hold it (`save`: one safetensors file per data-parallel rank, tensors `states` [slots, layers, mem_len,
hidden], `mask` [slots, mem_len], `stamps` [slots, 3]); `load` takes the streams of this rank from every file, so a
run resumes bit for bit under the same layout and exactly (memory for memory) under another.
"""
from __future__ import annotations

import glob
import os

import torch

DIRECTORY = "memory"


class StreamMemory:
    """The memories of the streams of data-parallel rank `rank` of `ranks`, for `streams` streams of `mem_len`."""

    def __init__(self, streams: int, rank: int, ranks: int, mem_len: int):
        self.streams, self.rank, self.ranks, self.mem_len = streams, rank, ranks, mem_len
        self.slots = streams // ranks
        self.states = self.mask = self.stamps = None  # allocated by the first write (its dtype, its device)

    def inputs(self, batch: dict) -> dict:
        """The model's `memory` and `memory_mask` for a micro-batch with fields stream, epoch, stream_step."""
        stream = batch["stream"]
        if self.states is None:
            return {"memory_mask": torch.zeros(len(stream), self.mem_len, dtype=torch.bool, device=stream.device)}
        slot = stream // self.ranks
        stamp = self.stamps[slot]
        follows = ((stamp[:, 0] == stream) & (stamp[:, 1] == batch["epoch"])
                   & (stamp[:, 2] + 1 == batch["stream_step"]))
        return {"memory": self.states[slot].transpose(0, 1), "memory_mask": self.mask[slot] & follows[:, None]}

    def update(self, batch: dict, out: dict) -> None:
        """Keep the model's next memory (`out`: its "memory" per layer [b, mem_len, hidden], "memory_mask")."""
        states = torch.stack(out["memory"], 1)  # [b, layers, mem_len, hidden]
        if self.states is None:
            self._allocate(states.shape[1:], states.dtype, states.device)
        slot = batch["stream"] // self.ranks
        self.states[slot] = states.detach()
        self.mask[slot] = out["memory_mask"]
        self.stamps[slot] = torch.stack([batch["stream"], batch["epoch"], batch["stream_step"]], 1)

    def _allocate(self, shape, dtype, device) -> None:
        self.states = torch.zeros(self.slots, *shape, dtype=dtype, device=device)
        self.mask = torch.zeros(self.slots, self.mem_len, dtype=torch.bool, device=device)
        self.stamps = torch.full((self.slots, 3), -1, dtype=torch.int64, device=device)

    def state(self) -> dict[str, torch.Tensor]:
        """Its tensors on the host ({} before the first write)."""
        if self.states is None:
            return {}
        return {"states": self.states.cpu(), "mask": self.mask.to(torch.uint8).cpu(), "stamps": self.stamps.cpu()}

    def load(self, files: list[str], device) -> None:
        """This rank's streams from the files of any data-parallel layout."""
        from safetensors import safe_open

        for path in files:
            with safe_open(path, framework="pt") as f:
                stamps = f.get_tensor("stamps")
                rows = [i for i, k in enumerate(stamps[:, 0].tolist()) if k >= 0 and k % self.ranks == self.rank]
                if not rows:
                    continue
                states = f.get_slice("states")
                if self.states is None:
                    first = states[0:1]
                    self._allocate(first.shape[1:], first.dtype, device)
                mask = f.get_tensor("mask").bool()
                for i in rows:
                    slot = int(stamps[i, 0]) // self.ranks
                    self.states[slot] = states[i:i + 1][0].to(device)
                    self.mask[slot], self.stamps[slot] = mask[i].to(device), stamps[i].to(device)


class Recurrence:
    """A recurrent model's memories across steps: one `StreamMemory` for training, one for evaluation (which
    starts again from its first step at every evaluation; not checkpointed)."""

    def __init__(self, streams: int, mem_len: int):
        self.streams, self.mem_len = streams, mem_len
        self.memories: dict[bool, StreamMemory] = {}

    def _memory(self, training: bool) -> StreamMemory:
        from pretrain.parallel import mcore

        if training not in self.memories:
            self.memories[training] = StreamMemory(self.streams, mcore.dp_rank(), mcore.dp_size(), self.mem_len)
        return self.memories[training]

    def inputs(self, model, batch: dict) -> dict:
        return self._memory(model.training).inputs(batch)

    def update(self, model, batch: dict, out: dict) -> None:
        self._memory(model.training).update(batch, out)

    def files(self) -> dict[str, dict[str, torch.Tensor]]:
        """The checkpoint's files of this rank (on TP rank 0: the other TP ranks hold the same memory)."""
        from pretrain.parallel import mcore

        memory = self._memory(True)
        state = memory.state() if mcore.tp_rank() == 0 else {}
        return {os.path.join(DIRECTORY, f"dp{memory.rank:03d}.safetensors"): state} if state else {}

    def load(self, ckpt: str, device) -> None:
        self._memory(True).load(sorted(glob.glob(os.path.join(ckpt, DIRECTORY, "*.safetensors"))), device)
