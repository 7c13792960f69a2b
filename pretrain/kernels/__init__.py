"""The fused-kernel seam. Model and optimizer code call these functions through this module
(`kernels.bias_gelu(...)`), so a GPU implementation can be bound in their place without touching the
callers. What is here are the plain-torch reference implementations: every replacement must match them.
"""
from __future__ import annotations

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
