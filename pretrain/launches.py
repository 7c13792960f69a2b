"""Kernel launches per training step: the host's share of a step (`ptm plan`'s host term, issue 39).

PyTorch eager issues each aten op that computes as one or more kernel launches, each costing the host tens of
microseconds of Python, dispatch and driver time; a step whose launches take the host longer than its kernels take
the GPU is bound by the host, whatever the GPU. `count(cfg)` counts them on any machine, a CPU included: a real
Trainer trains `cfg`'s model and objective narrowed to a width where compute is nothing (`narrow`: the same layers,
heads, objective, precision, ZeRO stage and optimizer, on the paths a GPU takes: multi-tensor optimizer loops and
SDPA's fused attention kernel), and a dispatch mode counts the ops of one step that launch a kernel (views,
allocations and host-side queries launch none) through a step of three micro-batches: its first, each further one,
and the optimizer's. Widths change no count (tests/test_launches.py). `calibrate(cfg)` times the same narrowed steps
on this machine's device: its host time per launch, what `ptm plan --launch-us` takes.

What the count leaves out (a GPU launches these differently; each is a few percent of a step): the fused LM loss
(liger-kernel's Triton kernel needs CUDA: counted unfused), compiled blocks (counted eager), tensor-parallel
all-reduces (counted at TP=1; `cost.tp_launches` adds them), a multi-tensor kernel's chunks (one launch per op here).
"""
from __future__ import annotations

import collections
import copy
import statistics
import tempfile
import time
from dataclasses import dataclass

from torch.utils._python_dispatch import TorchDispatchMode

from pretrain.config import Config, ConfigError
from pretrain.cost import Launches

HEAD_WIDTH = 8  # the narrowed model's head size
COUNTED_STEP = 3  # the step counted: the first two include the loop's start and DeepSpeed's first step
TIMED_STEPS = 3  # steps timed after it (`calibrate`)
ACCUMULATION = 3  # micro-batches of the counted step
# ops that launch no kernel: aliases and views (`OpOverload.is_view`) aside, allocations without a fill, metadata
# and host-side queries
NO_LAUNCH = frozenset({"detach", "alias", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                       "lift_fresh", "set_", "resize_", "is_nonzero", "sym_size", "sym_stride", "sym_numel",
                       "_unsafe_view", "_reshape_alias", "record_stream", "is_same_size",
                       "_has_compatible_shallow_copy_type"})


class KernelLaunches(TorchDispatchMode):
    """Counts the aten ops that launch a kernel on a GPU, by op name (`ops`), while `on`."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.on = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.on and not func.is_view and func.overloadpacket.__name__ not in NO_LAUNCH:
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def narrow(cfg: Config, accumulation: int, out_dir: str, width: int = HEAD_WIDTH) -> Config:
    """`cfg` at a width where compute is nothing, on one process with `accumulation` micro-batches of one sample,
    the kernels a GPU runs (`optimizer.multi_tensor=on`; attention dropout off, so that SDPA takes a fused kernel
    here as it does on a GPU, where its dropout is inside the kernel; eager blocks, the unfused loss), nothing saved
    or evaluated."""
    c = copy.deepcopy(cfg)
    m = c.model
    if not m.char_filters:  # (ELMo's biLM has no heads: counted at its own widths)
        hidden = m.num_heads * width
        if m.embedding_size and m.embedding_size != m.hidden_size:  # a factorised embedding stays factorised
            m.embedding_size = hidden // 2
        m.hidden_size, m.head_dim, m.ffn_hidden_size = hidden, width if m.head_dim else 0, 2 * hidden
    m.attention_dropout = 0.0
    c.parallel.tp = 1
    c.train.micro_batch_size, c.train.global_batch_size = 1, accumulation
    c.train.log_interval, c.train.eval_interval, c.checkpoint.interval = 10 ** 6, 0, 0
    c.optimizer.multi_tensor = "on"
    c.kernels, c.fused_lm_loss, c.checkpoint.init_from = "eager", "off", ""
    c.data.num_workers, c.out_dir = 0, out_dir
    return c


class _Enough(Exception):
    """The steps `_run` needs have run."""


@dataclass
class Counted:
    """What `_run` saw: the launches counted to the end of each backward pass of the counted step and to its end
    (`marks`), by op (`ops`), the seconds of the timed steps after it, the device they ran on."""
    marks: list
    ops: collections.Counter
    seconds: list
    device: str


def _run(cfg: Config, timed: int = 0, width: int = HEAD_WIDTH) -> Counted:
    """Step COUNTED_STEP of `cfg` narrowed (ACCUMULATION micro-batches) counted, and `timed` more steps timed."""
    from pretrain.train import Trainer

    counter, marks, seconds = KernelLaunches(), [], []
    with tempfile.TemporaryDirectory(prefix="ptm-launches-") as out:
        trainer = Trainer(narrow(cfg, ACCUMULATION, out, width))
        step, backward = trainer.train_step, trainer.engine.backward

        def measured(micro_batches):
            if len(seconds) == COUNTED_STEP + timed:
                raise _Enough  # (train.steps stays the config's: phases, e.g. ERNIE 2.0's stages, add up to it)
            counter.on = len(seconds) + 1 == COUNTED_STEP
            start = time.perf_counter()
            result = step(micro_batches)
            seconds.append(time.perf_counter() - start)
            if counter.on:
                marks.append(counter.total)
            counter.on = False
            return result

        def marked(*args, **kwargs):
            result = backward(*args, **kwargs)
            if counter.on:
                marks.append(counter.total)
            return result

        trainer.train_step, trainer.engine.backward = measured, marked
        try:
            with counter:
                trainer.fit()
        except _Enough:
            pass
        finally:
            trainer.close()
    return Counted(marks, counter.ops, seconds[COUNTED_STEP:], trainer.device_name)


def count(cfg: Config, width: int = HEAD_WIDTH, timed: int = 0) -> tuple[Launches, Counted]:
    """The launches of one step of `cfg` (the module's docstring), and what was counted and timed (`timed` more
    narrowed steps of ACCUMULATION micro-batches); trains a few narrowed steps on data.path."""
    if not cfg.data.path:
        raise ConfigError("counting launches trains a few narrowed steps: set data.path to a ptm dataset")
    counted = _run(cfg, timed, width)
    first, second, _, end = counted.marks
    per_micro_batch = second - first  # the middle one: the last adds the accumulation boundary's, counted with the step
    return Launches(first, per_micro_batch, end - first - 2 * per_micro_batch), counted


def calibrate(cfg: Config) -> tuple[Launches, float, str]:
    """(the launches of one step of `cfg`, this machine's host seconds per launch, its device's name): the median
    time of TIMED_STEPS uncounted narrowed steps over their launches. On a GPU those steps are bound by the host
    (their kernels are tiny), so the time is the host's."""
    launches, counted = count(cfg, timed=TIMED_STEPS)
    return launches, statistics.median(counted.seconds) / launches.of(ACCUMULATION), counted.device
