"""Kernel choices. The model calls its elementwise work through this module (`kernels.bias_gelu(...)`): the
plain-torch references that every faster path must match. The parallelize step (pretrain/engine.py) picks the
faster paths per run: `compile_model` (Inductor fuses the elementwise work of each block), liger-kernel's
`linear_cross_entropy` for the LM head; `describe` names what runs, for the log.
"""
from __future__ import annotations

import importlib.util
import os

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel


def bias_gelu(x: torch.Tensor, bias: torch.Tensor | None, approximate: str = "none") -> torch.Tensor:
    """GELU(x + bias); `approximate="tanh"` is GPT-2's gelu_new."""
    return F.gelu(x if bias is None else x + bias, approximate=approximate)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
               residual: torch.Tensor | None = None) -> torch.Tensor:
    """LayerNorm(x + residual): BERT's post-LN sublayer output."""
    if residual is not None:
        x = x + residual
    return F.layer_norm(x, weight.shape, weight, bias, eps)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Per-token softmax cross-entropy of vocab-parallel logits [..., V/tp]; 0 where labels == ignore_index.
    Like megatron-core's kernel it works in place: fp32 logits are shifted by their row maximum."""
    keep = labels != ignore_index
    loss = tensor_parallel.vocab_parallel_cross_entropy(logits.float(), torch.where(keep, labels, 0))
    return loss * keep


def fused_lm_loss_available(device: torch.device) -> str | None:
    """Why liger-kernel's fused linear cross-entropy cannot run here, or None when it can: it needs the package
    and a GPU, or Triton's interpreter (TRITON_INTERPRET=1) on a CPU, where the suite checks it."""
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel is not installed (pip install 'ptm[kernels]')"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return "its Triton kernels run on CUDA, or on a CPU only under TRITON_INTERPRET=1"
    return None


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                         vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed loss, correct predictions) of the logits x @ weight[:vocab_size].T + bias[:vocab_size] against
    `labels` (-100 ignored) through liger-kernel's fused linear cross-entropy, which computes the logits a chunk of
    tokens at a time and never holds them whole. The whole vocabulary must be on this rank (TP=1); the rows past
    `vocab_size` (padding) are left out, as masking their logits does. Equals `cross_entropy` of the logits."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    out = liger_fused_linear_cross_entropy(x, weight[:vocab_size], labels, None if bias is None else bias[:vocab_size],
                                           reduction="sum", return_predicted_tokens=True)
    return out.loss, ((out.predicted_tokens == labels) & (labels != -100)).sum()


def compile_model(model: torch.nn.Module) -> None:
    """torch.compile each transformer block in place (`Module.compile`): Inductor fuses the elementwise work
    around the matmuls. The model's code is unchanged; eager is the reference. The loss is not compiled: at TP=1
    liger-kernel's fused linear cross-entropy covers it, at TP>1 megatron-core's vocab-parallel cross-entropy
    talks to the other ranks (a graph break)."""
    for block in model.blocks:
        block.compile()


def describe(kernels: str, fused_lm_loss: bool, optimizer, device: torch.device) -> str:
    """One line naming the implementation of each kernel, for the training log."""
    attention = "flash / memory-efficient" if device.type == "cuda" else "math"
    loss = "liger-kernel fused linear cross-entropy" if fused_lm_loss else "megatron-core vocab-parallel cross-entropy"
    return (f"blocks {'torch.compile (Inductor)' if kernels == 'compile' else 'eager'}; "
            f"attention torch SDPA ({attention}); LM head {loss}; {type(optimizer).__name__} {optimizer.implementation}")
