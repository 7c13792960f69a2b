"""The parallelize step: wrap a model and its optimizer in a DeepSpeed engine as the config asks (ZeRO stage,
offload, fp16 loss scaling or bf16, clipping, accumulation), with megatron-core's TP x DP groups as its mpu, and
choose the kernels. The model stays unaware of all of it; what was decided comes back as one object.

    run = build(cfg, model, optimizer, scheduler)   # after mcore.initialize(cfg.parallel.tp, cfg.seed)
    run.engine, run.layout, run.kernels, run.fused_lm_loss
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass

import deepspeed
from deepspeed.accelerator import get_accelerator

from pretrain import kernels as K
from pretrain import signals
from pretrain.config import Config, ConfigError
from pretrain.parallel import mcore, multi_tensor
from pretrain.parallel.layout import Layout, undo_construction_step

NEVER = 2 ** 31 - 1  # DeepSpeed's own step prints: ptm logs instead
OURS = ("optimizer", "scheduler")  # ptm builds these; a user JSON may not


def ds_config(cfg: Config, dp: int) -> dict:
    """The DeepSpeed JSON for `cfg` on `dp` data-parallel ranks, merged over the user's `deepspeed_config`
    (which must agree with every key generated here)."""
    t, z, f = cfg.train, cfg.zero, cfg.fp16
    zero = {"stage": z.stage}
    if z.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}  # page-locked: faster copies to the GPU
    ours = {
        "train_batch_size": t.global_batch_size,
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": t.global_batch_size // (t.micro_batch_size * dp),
        "gradient_clipping": t.grad_clip,  # DeepSpeed's default is 1.0, not off: always say it
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # ptm's AdamW/LAMB are ZeRO-aware (see parallel/layout.py)
        "zero_force_ds_cpu_optimizer": False,
        "fp16": {"enabled": cfg.precision == "fp16", "loss_scale": 0,
                 "initial_scale_power": f.initial_scale_power, "loss_scale_window": f.loss_scale_window,
                 "hysteresis": f.hysteresis, "min_loss_scale": f.min_loss_scale},
        "bf16": {"enabled": cfg.precision == "bf16"},
        # bf16 accumulates gradients in bf16 unless told; fp32 takes BF16_Optimizer at ZeRO-1. DeepSpeed reduces
        # them in communication_data_type (default: the model's dtype) at every stage: fp32 accumulation means
        # fp32 reduction too
        "data_types": {"grad_accum_dtype": cfg.grad_accum_dtype if cfg.precision == "bf16" else None},
        "steps_per_print": NEVER,
        "wall_clock_breakdown": False,
        # ptm times its own steps; DeepSpeed's throughput timer synchronises the device at every micro-batch's
        # start and end (two host syncs each, on an H200; tests/test_syncs.py counts them)
        "timers": {"throughput": {"enabled": False}},
    }
    if cfg.precision == "bf16" and cfg.grad_accum_dtype == "fp32":
        ours["communication_data_type"] = "fp32"
    if not cfg.deepspeed_config:
        return ours
    user = _read_user(cfg.deepspeed_config)
    problems = [f"{cfg.deepspeed_config}: {k} is ptm's to build (optimizer.* and the schedule in the YAML config); "
                f"remove it" for k in OURS if k in user]
    problems += [f"{cfg.deepspeed_config}: {key}={theirs!r} but the config gives {mine!r}; make them agree or "
                 f"remove {key} from the JSON" for key, mine, theirs in _disagreements(ours, user)]
    if problems:
        raise ConfigError("\n".join(problems))
    return _merge(user, ours)


def _read_user(path: str) -> dict:
    try:
        with open(path) as f:
            user = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"deepspeed_config {path} not found; fix the path or leave deepspeed_config empty") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"deepspeed_config {path} is not valid JSON ({e}); fix the file") from None
    if not isinstance(user, dict):
        raise ConfigError(f"deepspeed_config {path} must hold a JSON object of DeepSpeed settings")
    return user


def _disagreements(ours: dict, user: dict, prefix: str = ""):
    for key, mine in ours.items():
        if key not in user:
            continue
        theirs = user[key]
        if isinstance(mine, dict) and isinstance(theirs, dict):
            yield from _disagreements(mine, theirs, f"{prefix}{key}.")
        elif theirs != mine and not (key == "enabled" and not mine and not theirs):
            yield f"{prefix}{key}", mine, theirs


def _merge(user: dict, ours: dict) -> dict:
    out = dict(user)
    for key, value in ours.items():
        out[key] = _merge(user[key], value) if isinstance(value, dict) and isinstance(user.get(key), dict) else value
    return out


def _allow_half_on_cpu() -> None:
    """DeepSpeed's CPU accelerator calls fp16 unsupported unless the CPU has oneDNN's fp16 instructions
    (AVX512-FP16/AMX), but torch computes fp16 on any CPU (by conversion, slowly). The CPU path exists to test
    the GPU program, so fp16 is allowed there; on GPUs DeepSpeed's own answer stands."""
    accelerator = get_accelerator()
    if accelerator.device_name() == "cpu":
        accelerator.is_fp16_supported = lambda: True


def _nothing_to_build() -> None:
    """A job start compiles nothing: a build is a child process that a stop signal kills, it costs every restart, and
    two installations sharing torch's extensions cache (~/.cache/torch_extensions) race on it. The one op DeepSpeed
    JIT-builds as a run starts is its CPU shared-memory all-reduce (`deepspeed_shm_comm`, ~40 s), which serves only
    `inference_all_reduce` (DeepSpeed-Inference's AutoTP layers); ptm's training reduces through torch.distributed
    and megatron-core, so ptm marks the op unavailable (DeepSpeed's own switch: its comm backend then keeps torch's
    all-reduce). Anything else that JIT-builds (an optimizer op a user's DeepSpeed JSON asks for) builds in a
    directory of this installation's own, unless TORCH_EXTENSIONS_DIR says otherwise."""
    import deepspeed.ops

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(
        os.path.expanduser("~"), ".cache", "torch_extensions", "ptm-" + hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]))
    shm = get_accelerator().get_op_builder("ShareMemCommBuilder")
    if shm is not None:
        deepspeed.ops.__compatible_ops__[shm.NAME] = False


@dataclass
class Parallelized:
    """What the parallelize step decided: the DeepSpeed engine, the layout of its optimizer's tensors (ZeRO
    partitions x TP shards), the kernels the blocks run (eager | compile) and whether the LM head runs the fused linear
    cross-entropy. The trainer holds it; the objectives receive `fused_lm_loss`."""

    engine: object
    layout: Layout
    kernels: str
    fused_lm_loss: bool


def _fused_lm_loss(cfg: Config, device) -> bool:
    """Whether the LM head runs liger-kernel's fused linear cross-entropy (`fused_lm_loss`)."""
    if not cfg.lm_loss_fusable():
        return False
    why = K.fused_lm_loss_available(device)
    if why and cfg.fused_lm_loss == "on":
        raise ConfigError(f"fused_lm_loss=on: {why}; set fused_lm_loss=auto or off")
    return why is None and (cfg.fused_lm_loss == "on" or device.type == "cuda")


def build(cfg: Config, model, optimizer, scheduler) -> Parallelized:
    """A DeepSpeed engine over `model` (already on its device) with ptm's optimizer and LR scheduler, and the kernels
    chosen. The optimizer gets the engine's `Layout`: LAMB's trust ratios are per whole parameter whatever the
    partitioning, and parameters a phase does not train are left alone in any layout (`_Adam.idle`)."""
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    _allow_half_on_cpu()
    _nothing_to_build()
    signals.pause("build")
    kernels = cfg.kernels_on(next(model.parameters()).device.type == "cuda")
    if kernels == "compile":
        K.compile_model(model, dynamic=cfg.data.unpadded)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           mpu=mcore.DeepSpeedMPU(), config=ds_config(cfg, mcore.dp_size()),
                                           dist_init_required=False)
    if cfg.zero.stage == 3:
        for module, param in model.external_parameters():
            deepspeed.zero.register_external_parameter(module, param)
    undo_construction_step(engine)
    multi_tensor.use(engine)
    layout = optimizer.layout = Layout.of(engine)
    return Parallelized(engine, layout, kernels, _fused_lm_loss(cfg, next(model.parameters()).device))
