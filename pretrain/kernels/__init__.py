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


fused_lm_loss_calls = 0  # linear_cross_entropy calls in this process: tests check that training runs through it


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
    `vocab_size` (padding) are left out, as masking their logits does. Equals `cross_entropy` of the logits.

    liger computes the gradients in this forward pass: the weight and bias gradients are summed over the chunks in
    fp32 (`accum_dtype`), not in bf16; an fp16 loss scale would come too late (`Config.lm_loss_fusable`: not under
    fp16). Two host syncs per call are liger-kernel's own (0.8, ops/fused_linear_cross_entropy.py): the forward's
    `target_mask.sum().item()` and the backward's `torch.equal(grad_output, 1.0)`."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    global fused_lm_loss_calls
    fused_lm_loss_calls += 1
    out = liger_fused_linear_cross_entropy(x, weight[:vocab_size], labels, None if bias is None else bias[:vocab_size],
                                           reduction="sum", accum_dtype=torch.float32, return_predicted_tokens=True)
    return out.loss, ((out.predicted_tokens == labels) & (labels != -100)).sum()


def compile_model(model: torch.nn.Module, dynamic: bool = False) -> None:
    """torch.compile each transformer block in place (`Module.compile`): Inductor fuses the elementwise work
    around the matmuls. The model's code is unchanged; eager is the reference. The loss is not compiled: at TP=1
    liger-kernel's fused linear cross-entropy covers it, at TP>1 megatron-core's vocab-parallel cross-entropy
    talks to the other ranks (a graph break). The blocks share their graphs (the weights are graph inputs).

    `dynamic` (unpadded batches, whose row count changes every micro-batch): the graphs take any row count from the
    first compilation on (dynamo's default compiles a static graph first and recompiles at the second shape); a
    micro-batch of one row adds one more set (dynamo specialises sizes 0 and 1). Weights stay static."""
    for block in model.blocks:
        block.compile(dynamic=True if dynamic else None)


def attention(cfg, device: torch.device) -> str:
    """The kernel that torch SDPA picks on `device` for this run's training attention, asked of SDPA itself
    (`torch._fused_sdp_choice`, which `F.scaled_dot_product_attention` consults) with the model's dtype, head size,
    dropout and mask: BERT-like models pass a padding mask (block-diagonal when unpadded), which flash takes none of;
    GPT-2 none (causal). NEZHA's relative positions are computed without SDPA."""
    from torch.nn.attention import SDPBackend

    m = cfg.model
    if m.position_encoding == "relative":
        return "ptm's matmuls + softmax (relative positions)"
    s, dtype = cfg.data.seq_len, {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.precision]
    q = torch.zeros(1, m.num_heads // cfg.parallel.tp, s, m.hidden_size // m.num_heads, dtype=dtype, device=device)
    mask = None if m.causal else "block-diagonal" if cfg.data.unpadded else "padding"
    bias = None if mask is None else q.new_zeros(1, 1, s if cfg.data.unpadded else 1, s)  # SDPA's form of a bool mask
    choice = SDPBackend(torch._fused_sdp_choice(q, q, q, bias, m.attention_dropout, m.causal))
    name = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "memory-efficient",
            SDPBackend.CUDNN_ATTENTION: "cuDNN"}.get(choice, choice.name.lower())
    return f"torch SDPA {name} ({f'{mask} mask' if mask else 'causal, no mask'})"


def describe(cfg, kernels: str, fused_lm_loss: bool, optimizer, device: torch.device) -> str:
    """One line naming the implementation of each kernel, for the training log."""
    if fused_lm_loss:
        loss = "liger-kernel fused linear cross-entropy (fp32 gradient sums)"
    else:
        loss = "megatron-core vocab-parallel cross-entropy" + (
            " (not fused under fp16: liger-kernel computes its gradients before the loss scale)"
            if cfg.precision == "fp16" and cfg.fused_lm_loss == "auto" else "")
    blocks = "torch.compile (Inductor)" if kernels == "compile" else "eager"
    return (f"blocks {blocks}; attention {attention(cfg, device)}; LM head {loss}; "
            f"{type(optimizer).__name__} {optimizer.implementation}")
