"""Learning-rate schedules: linear warmup, then linear | poly | cosine decay to min_lr, or constant."""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.optim.lr_scheduler import LambdaLR

# fraction of (lr - min_lr) left after `progress` (0..1) of the decay
DECAYS = {
    "linear": lambda progress, power: 1 - progress,
    "poly": lambda progress, power: (1 - progress) ** power,
    "cosine": lambda progress, power: 0.5 * (1 + math.cos(math.pi * progress)),
    "constant": lambda progress, power: 1.0,
}


@dataclass(frozen=True)
class Schedule:
    """The learning rate of optimizer step `step` (from 0): lr * step / warmup_steps during warmup, then the
    decay from lr at the end of warmup to min_lr at total_steps, and min_lr after that."""

    lr: float
    total_steps: int
    warmup_steps: int = 0
    kind: str = "linear"
    min_lr: float = 0.0
    power: float = 1.0
    position: Callable[[int], float] | None = None  # an optimizer step's place in the schedule (None: the step)

    def __post_init__(self):
        if self.kind not in DECAYS:
            raise ValueError(f"unknown schedule {self.kind!r}; choose one of {', '.join(DECAYS)}")

    @classmethod
    def from_config(cls, optimizer, total_steps: int, train=None) -> Schedule:
        """From a config's `optimizer` section (lr, schedule, warmup_steps, min_lr, poly_power, decay_steps) for a run
        of `total_steps`; with a `train` section that ramps the batch (train.batch_rampup), the schedule counts samples,
        in steps of the whole global batch (so its warmup and decay cover the samples they do without the ramp)."""
        position = None
        if train is not None and train.batch_rampup:
            position = functools.partial(_full_batches, train)
            total_steps = position(total_steps)
        return cls(lr=optimizer.lr, total_steps=optimizer.decay_end(total_steps),
                   warmup_steps=optimizer.warmup(total_steps),
                   kind=optimizer.schedule, min_lr=optimizer.min_lr, power=optimizer.poly_power, position=position)

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * step / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return self.min_lr + (self.lr - self.min_lr) * DECAYS[self.kind](progress, self.power)

    def scheduler(self, optimizer: torch.optim.Optimizer) -> LambdaLR:
        """A torch LambdaLR following this schedule for an optimizer whose groups were created with `lr`;
        call its step() after each optimizer.step()."""
        place = self.position or (lambda step: step)
        return LambdaLR(optimizer, lambda step: self(place(step)) / self.lr)


def _full_batches(train, step: int) -> float:
    """Optimizer step `step`'s place in a schedule that counts samples: the whole global batches read before it."""
    return train.samples_before(step) / train.global_batch_size
