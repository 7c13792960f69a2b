"""Run under torchrun: for each named config, wrap a small stack of Linear layers in a DeepSpeed engine built from
ptm's own DeepSpeed config (pretrain/engine.py's ds_config), train two optimizer steps and record every collective
of the second (the first traces ZeRO-3's module order): its kind, dtype and the elements of its whole buffer.
Rank 0 writes OUT/NAME.json: {"n": parameters, "accumulation": micro batches per step, "sent": {"KIND DTYPE":
elements}}, for tests/test_speed.py to compare with the speed model's collectives.

    torchrun --nproc_per_node 2 tests/comm_worker.py OUT '{"NAME": ["CONFIG", "key=value", ...], ...}'
"""
import collections
import json
import os
import sys

import deepspeed
import torch
import torch.distributed as dist

from pretrain import engine as E
from pretrain.config import load

KINDS = {"all_reduce": "all-reduce", "reduce": "reduce-scatter", "reduce_scatter_tensor": "reduce-scatter",
         "all_gather_into_tensor": "all-gather"}  # a reduce per owner rank adds up to a reduce-scatter's buffer
SENT = collections.Counter()


def record(name: str):
    """Wrap torch.distributed.NAME (DeepSpeed's torch backend looks it up at each call) to count what it sends;
    scalars (norms, overflow flags) are left out."""
    collective = getattr(dist, name)

    def wrapped(*args, **kwargs):
        named = {**dict(zip(("output_tensor", "input_tensor", "group") if "tensor" in name else ("tensor",), args)),
                 **kwargs}
        tensor = named.get("input_tensor", named.get("tensor"))
        whole = tensor.numel() * (dist.get_world_size(named.get("group")) if name == "all_gather_into_tensor" else 1)
        if tensor.numel() > 64:
            SENT[f"{KINDS[name]} {str(tensor.dtype).removeprefix('torch.')}"] += whole
        return collective(*args, **kwargs)

    setattr(dist, name, wrapped)


def run(overrides: list) -> dict:
    cfg = load(overrides[0], overrides[1:])
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(4)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    accumulation = cfg.train.global_batch_size // (cfg.train.micro_batch_size * dist.get_world_size())
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                           config=E.ds_config(cfg, dist.get_world_size()))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision, torch.float32)
    for step in range(2):
        SENT.clear()
        for _ in range(accumulation):
            loss = engine(torch.randn(cfg.train.micro_batch_size, 128, dtype=dtype)).float().square().mean()
            engine.backward(loss)
            engine.step()
    n = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    engine.destroy()
    return {"n": n, "accumulation": accumulation, "sent": dict(SENT)}


if __name__ == "__main__":
    out, runs = sys.argv[1], json.loads(sys.argv[2])
    for name in KINDS:
        record(name)
    deepspeed.init_distributed(dist_backend="gloo")
    E._allow_half_on_cpu()
    for name, overrides in runs.items():
        facts = run(overrides)
        if dist.get_rank() == 0:
            with open(f"{out}/{name}.json", "w") as f:
                json.dump(facts, f)
    dist.destroy_process_group()
    # Leave without the interpreter's exit: once, under a loaded CI machine, a C++ destructor run at exit aborted
    # ("terminate called without an active exception") after every result was written; the results are on disk.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
