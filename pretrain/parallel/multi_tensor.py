"""DeepSpeed's BF16_Optimizer (bf16 weights with fp32 gradient accumulation: ZeRO-1, ptm's bf16 default) walks the
parameters one at a time, three times a step: it casts each bf16 gradient to fp32 and adds it to the fp32 one (two
kernels), takes each gradient's norm, and multiplies each by the clipping coefficient after asking the device
whether to (a host sync). On a GPU each is a kernel launch paid on the host: about 1,200 a step for BERT-large's 302
parameters, a third of the step's launches, where the step was bound by its host (docs/performance.md, the H200).
`use(engine)` runs the same arithmetic in a few kernels:

- accumulation: the gradients of consecutive parameters are concatenated (at most CHUNK elements at a time) and
  added to their run of the fp32 gradients' flat buffer in one kernel: the same sum, element by element;
- the norm: one multi-tensor norm over the gradients, handed to DeepSpeed's own global norm as one tensor, which
  adds the squares up across the tensor-parallel group as before;
- clipping: one multi-tensor multiply by min(coefficient, 1): the same products, and no host sync.
"""
from __future__ import annotations

import torch
from deepspeed.runtime import bf16_optimizer as ds_bf16

from pretrain.optim.norms import sum_of_squares

CHUNK = 1 << 25  # bf16 elements concatenated at a time (64 MiB)
DEEPSPEED = {"get_global_norm_of_tensors": ds_bf16.get_global_norm_of_tensors,
             "clip_tensors_by_global_norm": ds_bf16.clip_tensors_by_global_norm}


def use(engine) -> bool:
    """Give `engine`'s optimizer the multi-tensor loops when it is DeepSpeed's BF16_Optimizer in the mode they cover
    (gradients accumulated after the backward pass, no expert-parallel folding); whether it did."""
    opt = engine.optimizer
    if type(opt) is not ds_bf16.BF16_Optimizer or opt.immediate_grad_update or \
            getattr(opt, "autoep_folding_tp_group", None) is not None:
        return False
    opt.update_hp_grads = lambda clear_lp_grads=False: accumulate(opt, clear_lp_grads)
    ds_bf16.get_global_norm_of_tensors = global_norm
    ds_bf16.clip_tensors_by_global_norm = clip
    return True


@torch.no_grad()
def accumulate(opt, clear_lp_grads: bool = False) -> None:
    """BF16_Optimizer.update_hp_grads: each parameter's fp32 gradient += its bf16 gradient, by runs of consecutive
    parameters (their fp32 gradients are consecutive views of one flat buffer per group)."""
    for i, group in enumerate(opt.bf16_groups):
        hp, flat = opt.fp32_groups_gradients[i], opt.fp32_groups_gradients_flat[i]
        has = opt.fp32_groups_has_gradients[i]
        run, start, size = [], 0, 0
        for j, lp in enumerate(group + [None]):
            g = lp.grad if lp is not None else None
            if run and (g is None or size + g.numel() > CHUNK):
                offset = hp[start].data_ptr() - flat.data_ptr()
                flat.narrow(0, offset // flat.element_size(), size).add_(torch.cat(run))
                run, size = [], 0
            if g is None:
                continue
            if not run:
                start = j
            run.append(g.reshape(-1))
            size += g.numel()
            lp._hp_grad = hp[j]
            has[j] = True
        if clear_lp_grads:
            torch._foreach_zero_([lp.grad for lp in group if lp.grad is not None])


def global_norm(input_tensors, norm_type=2, **kwargs):
    """DeepSpeed's get_global_norm_of_tensors with the local part as one multi-tensor norm (L2 over tensors of one
    device and dtype; anything else goes to DeepSpeed's own loop)."""
    tensors = list(input_tensors)
    if float(norm_type) != 2.0 or len(tensors) < 2 or len({(t.device, t.dtype) for t in tensors}) > 1:
        return DEEPSPEED["get_global_norm_of_tensors"](tensors, norm_type, **kwargs)
    local = sum_of_squares(tensors).sum().sqrt()
    return DEEPSPEED["get_global_norm_of_tensors"]([local], norm_type, **kwargs)


def clip(input_tensors, max_norm=1.0, global_norm=None, mpu=None, eps=1e-6):
    """DeepSpeed's clip_tensors_by_global_norm as one multi-tensor multiply by min(coefficient, 1) (x * 1 is x)."""
    tensors = list(input_tensors)
    if global_norm is None or not torch.is_tensor(global_norm) or not tensors:
        return DEEPSPEED["clip_tensors_by_global_norm"](tensors, max_norm, global_norm, mpu, eps)
    coef = (max_norm / (global_norm + eps)).clamp(max=1.0)
    torch._foreach_mul_([t.detach() for t in tensors], coef)
    return global_norm
