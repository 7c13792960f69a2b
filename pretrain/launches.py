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
Attention with a mask that needs a gradient and RMSNorm (T5's position bias and norm), which a CPU decomposes, are
counted as the one kernel each way a GPU runs (`_fused`).
"""
from __future__ import annotations

import collections
import contextlib
import copy
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pretrain import families
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


# ops a CUDA graph capture refuses or gets wrong: a host sync (a tensor's value read on the host) or an output whose
# size depends on the data; indexing by a boolean mask is one too (it finds the mask's nonzeros), and so is a copy
# between the host and the device (`_to_copy` / `copy_` across devices)
CAPTURE_UNSAFE = frozenset({"_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select", "unique",
                            "_unique", "_unique2", "unique_dim", "unique_consecutive", "repeat_interleave",
                            "bincount", "histc", "masked_scatter"})


class KernelLaunches(TorchDispatchMode):
    """Counts the aten ops that launch a kernel on a GPU, by op name (`ops`), while `on`; and, by op name too
    (`unsafe`), the ops dispatched while `in_blocks` (the transformer blocks' forward and backward passes: the region
    a CUDA graph would capture) that such a capture refuses (CAPTURE_UNSAFE, boolean-mask indexing, copies between
    devices)."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.unsafe: collections.Counter = collections.Counter()
        self.on = False
        self.paused = 0  # inside an op counted as one kernel (`_OneKernelAttention`)
        self.in_blocks = 0  # depth: a checkpointed block recomputes its forward inside its backward

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if self.on and not self.paused and not func.is_view and name not in NO_LAUNCH:
            self.ops[name] += 1
        if self.on and self.in_blocks and _capture_unsafe(name, args):
            self.unsafe[name] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def pause(self):
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1

    def one(self, name: str) -> None:
        """Count one launch of `name` (an op whose own ops run paused)."""
        if self.on:
            self.ops[name] += 1

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def _capture_unsafe(name: str, args) -> bool:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name in CAPTURE_UNSAFE:
        return True
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):  # (self, indices, ...): a boolean mask?
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ()))
    return name in ("_to_copy", "copy_") and len({t.device.type for t in tensors}) > 1


class _OneKernel(torch.autograd.Function):
    """`fn(*tensors)` counted as the one kernel a GPU runs each way (`name`, `name`_backward), whatever this device
    runs for it (uncounted; the backward recomputes it)."""

    @staticmethod
    def forward(ctx, counter, name, fn, *tensors):
        ctx.counter, ctx.name, ctx.fn = counter, name, fn
        ctx.save_for_backward(*tensors)
        counter.one(name)
        with counter.pause():
            return fn(*tensors)

    @staticmethod
    def backward(ctx, grad):
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        needed = [t for t in inputs if t.requires_grad]
        with ctx.counter.pause(), torch.enable_grad():
            found = iter(torch.autograd.grad(ctx.fn(*inputs), needed, grad))
        ctx.counter.one(ctx.name + "_backward")
        return None, None, None, *(next(found) if t.requires_grad else None for t in inputs)


_SDPA, _RMS_NORM = torch.nn.functional.scaled_dot_product_attention, torch.nn.functional.rms_norm


def _fused(counter: KernelLaunches) -> dict:
    """Replacements of functions a CPU decomposes and a GPU runs as one kernel each way, counted so: SDPA with an
    additive mask that needs a gradient (T5's learned position bias: SDPA's math path here, its memory-efficient
    kernel on a GPU) and RMSNorm (T5's norm: pow, mean, rsqrt and products here, torch's `_fused_rms_norm` on CUDA)."""
    def attention(q, k, v, attn_mask=None, **kwargs):
        if not (isinstance(attn_mask, torch.Tensor) and attn_mask.requires_grad and torch.is_grad_enabled()):
            return _SDPA(q, k, v, attn_mask=attn_mask, **kwargs)
        return _OneKernel.apply(counter, "scaled_dot_product_attention",
                                lambda *t: _SDPA(*t[:3], attn_mask=t[3], **kwargs), q, k, v, attn_mask)

    def rms_norm(x, normalized_shape, weight=None, eps=None):
        if weight is None or not torch.is_grad_enabled():
            return _RMS_NORM(x, normalized_shape, weight, eps)
        return _OneKernel.apply(counter, "rms_norm", lambda a, w: _RMS_NORM(a, normalized_shape, w, eps), x, weight)

    return {"scaled_dot_product_attention": attention, "rms_norm": rms_norm}


def watch_blocks(model: torch.nn.Module, counter: KernelLaunches) -> list:
    """Hooks marking `counter.in_blocks` through the forward and backward passes of every module in a `blocks`
    ModuleList of `model` (each architecture's transformer layers); returns the handles. The backward pass is marked
    by gradient hooks (from the gradient of a block's first output to that of its first input), which launch nothing:
    a module's full backward hooks would add a kernel per block."""
    opened = []  # per block call in flight: whether its input's gradient will close a backward region

    def enter(*_):
        counter.in_blocks += 1

    def leave(*_):
        counter.in_blocks -= 1

    def first(values) -> torch.Tensor | None:
        values = values if isinstance(values, (tuple, list)) else (values,)
        return next((v for v in values if isinstance(v, torch.Tensor) and v.requires_grad), None)

    def before(module, args):
        enter()
        x = first(args) if torch.is_grad_enabled() else None
        if x is not None:
            x.register_hook(leave)
        opened.append(x is not None)

    def after(module, args, output):
        leave()
        y = first(output)
        if opened.pop():
            if y is None:  # no gradient flows back through the block: nothing to mark, and nothing to close
                raise RuntimeError("a block whose input needs a gradient returned no output that does")
            y.register_hook(enter)

    handles = []
    for module in model.modules():
        if isinstance(getattr(module, "blocks", None), torch.nn.ModuleList):
            for block in module.blocks:
                handles += [block.register_forward_pre_hook(before), block.register_forward_hook(after)]
    return handles


def narrow(cfg: Config, accumulation: int, out_dir: str, width: int = HEAD_WIDTH) -> Config:
    """`cfg` at a width where compute is nothing, on one process with `accumulation` micro-batches of one sample,
    the kernels a GPU runs (`optimizer.multi_tensor=on`; attention dropout off, so that SDPA takes a fused kernel
    here as it does on a GPU, where its dropout is inside the kernel; eager blocks, the unfused loss), nothing saved
    or evaluated, with data.path's vocabulary (a preset's, e.g. bert-base's 30522 words, would not fit the dataset;
    the launches do not depend on it)."""
    c = copy.deepcopy(cfg)
    m = c.model
    m.vocab_size = 0
    if families.get(m.arch).attends:  # (a model without heads, ELMo's biLM, is counted at its own widths)
        hidden = m.num_heads * width
        if m.embedding_size and m.embedding_size != m.hidden_size:  # a factorised embedding stays factorised
            m.embedding_size = hidden // 2
        m.hidden_size, m.head_dim, m.ffn_hidden_size = hidden, width if m.head_dim else 0, 2 * hidden
    m.attention_dropout = 0.0
    c.parallel.tp = 1
    c.train.micro_batch_size, c.train.global_batch_size = 1, accumulation
    c.train.batch_rampup, c.train.skip_steps = [], []  # (every step counted trains `accumulation` micro-batches)
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
    (`marks`), by op (`ops`), the seconds of the timed steps after it, the device they ran on, and the ops of the
    counted step inside the blocks that a CUDA graph capture refuses (`unsafe`, by op: none means the blocks' forward
    and backward passes can be captured as they are)."""
    marks: list
    ops: collections.Counter
    seconds: list
    device: str
    unsafe: collections.Counter


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
        hooks = watch_blocks(trainer.model, counter)
        originals = {name: getattr(torch.nn.functional, name) for name in _fused(counter)}
        for name, replacement in _fused(counter).items():
            setattr(torch.nn.functional, name, replacement)
        try:
            with counter:
                trainer.fit()
        except _Enough:
            pass
        finally:
            for name, original in originals.items():
                setattr(torch.nn.functional, name, original)
            for hook in hooks:
                hook.remove()
            trainer.close()
    return Counted(marks, counter.ops, seconds[COUNTED_STEP:], trainer.device_name, counter.unsafe)


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
