"""Run under torchrun (or alone): train several tiny configs one after another in the same process group, each
into OUT/NAME, so that tests compare layouts without paying process start-up for each. Rank 0 writes
OUT/NAME/facts.json: DeepSpeed's optimizer wrapper, every optimizer state's step count, the loss scale, the
dtypes of the tensors its reduction collectives carried (gradient buckets; metrics and counts are too small to count),
the trainable parameters no non-zero gradient reached on this rank and those the run names idle at every step.

    torchrun --nproc_per_node 4 tests/engine_worker.py OUT '{"NAME": ["CONFIG", "key=value", ...], ...}'

A NAME ending in -naive runs LAMB as if unaware of ZeRO (trust ratios of whole partitions, DeepSpeed #490). For
one ending in -resume, the checkpoint its run wrote at checkpoint.interval is copied to OUT/NAME-again, and a
run with another seed (which the checkpoint must override) resumes it there and trains to the end.
"""
import faulthandler
import json
import shutil
import sys

import torch
import torch.distributed as dist

from pretrain.config import load
from pretrain.parallel import mcore
from pretrain.parallel.layout import loss_scale
from pretrain.train import Trainer


REDUCTIONS = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce", "all_reduce_coalesced")
reduced: set[str] = set()


def record_reductions() -> None:
    """Note the dtype of every floating tensor of over 4096 elements that a reduction collective sends."""
    for name in REDUCTIONS:
        def recording(*args, _real=getattr(dist, name), **kwargs):
            for t in [*args, *kwargs.values()]:
                for x in t if isinstance(t, (list, tuple)) else [t]:
                    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 4096:
                        reduced.add(str(x.dtype).removeprefix("torch."))
            return _real(*args, **kwargs)
        setattr(dist, name, recording)


def watch_gradients(trainer: Trainer) -> set[str]:
    """The trainable parameters that a gradient with a non-zero element reaches, filled as the run trains."""
    reached: set[str] = set()
    for n, p in trainer.model.named_parameters():
        if p.requires_grad:
            p.register_hook(lambda grad, n=n: reached.add(n) if n not in reached and grad.any() else None)
    return reached


def facts(trainer: Trainer, reached: set[str]) -> dict:
    steps = sorted({int(s["step"]) for s in trainer.optimizer.state.values() if s})
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, steps)
    return {"wrapper": type(trainer.engine.optimizer).__name__, "optimizer_steps": sorted({s for r in every for s in r}),
            "loss_scale": loss_scale(trainer.engine.optimizer), "skipped_steps": trainer.engine.skipped_steps,
            "deterministic": torch.are_deterministic_algorithms_enabled(), "reduced_dtypes": sorted(reduced),
            "unreached": sorted(n for n, p in trainer.model.named_parameters() if p.requires_grad and n not in reached),
            "always_idle": sorted(set.intersection(*(set(trainer.idle(s)) for s in range(trainer.cfg.train.steps))))}


if __name__ == "__main__":
    faulthandler.enable(all_threads=True)  # a rank that aborts (SIGABRT from C++) shows where its threads were
    out, runs = sys.argv[1], json.loads(sys.argv[2])

    record_reductions()

    def train(name: str, overrides: list, *more: str) -> None:
        reduced.clear()
        trainer = Trainer(load(overrides[0], [*overrides[1:], f"out_dir={out}/{name}", *more]))
        if name.endswith("-naive"):
            trainer.optimizer.layout = None
        reached = watch_gradients(trainer)
        trainer.fit()
        record = facts(trainer, reached)
        trainer.close()
        if dist.get_rank() == 0:
            with open(f"{out}/{name}/facts.json", "w") as f:
                json.dump(record, f)

    try:
        for name, overrides in runs.items():
            train(name, overrides)
            if name.endswith("-resume"):
                cfg = load(overrides[0], overrides[1:])
                middle = f"step_{cfg.checkpoint.interval:08d}"
                if dist.get_rank() == 0:
                    shutil.copytree(f"{out}/{name}/checkpoints/{middle}", f"{out}/{name}-again/checkpoints/{middle}")
                    with open(f"{out}/{name}-again/checkpoints/latest", "w") as f:
                        f.write(middle)
                dist.barrier()
                train(f"{name}-again", overrides, f"seed={cfg.seed + 1}")
    finally:  # as pretrain.train.train does: a gloo group left to the interpreter's exit can abort a rank (SIGABRT)
        mcore.shutdown()
