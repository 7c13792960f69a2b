"""Kernel choices. The model calls its elementwise work through this module (`kernels.bias_act(...)`): the
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

from pretrain import families
from pretrain.models.config import FUSED_CHUNK_BYTES


def bias_act(x: torch.Tensor, bias: torch.Tensor | None, activation: str = "gelu") -> torch.Tensor:
    """act(x + bias): gelu, gelu_tanh (GPT-2's gelu_new), relu (T5 1.0) or tanh."""
    x = x if bias is None else x + bias
    if activation in ("relu", "tanh"):
        return getattr(torch, activation)(x)
    return F.gelu(x, approximate="tanh" if activation == "gelu_tanh" else "none")


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
               residual: torch.Tensor | None = None) -> torch.Tensor:
    """LayerNorm(x + residual): BERT's post-LN sublayer output."""
    if residual is not None:
        x = x + residual
    return F.layer_norm(x, weight.shape, weight, bias, eps)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Per-token softmax cross-entropy of vocab-parallel logits [..., V/tp]; 0 where labels == ignore_index.
    Like megatron-core's kernel it works in place: fp32 logits are overwritten (with their softmax), so anything
    else that reads them runs first."""
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


@torch.compiler.disable  # eager in a compiled model: dynamo cannot trace addmm(out_dtype=, out=) (torch 2.11)
def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                         vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed loss, correct predictions) of the logits x @ weight[:vocab_size].T + bias[:vocab_size] against
    `labels` (-100 ignored), fused: the logits exist a chunk of tokens at a time, never whole. The whole vocabulary
    must be on this rank (TP=1); the rows past `vocab_size` (padding) are left out, as masking their logits does.
    Equals `cross_entropy` of the logits.

    liger-kernel's Triton kernel computes each chunk's loss, prediction and logit gradient in one pass; ptm's chunk
    loop (`_FusedLinearCrossEntropy`) makes the matmuls around it. The input, weight and bias gradients are computed
    in this forward pass, the weight and bias ones summed over the chunks in fp32, not in bf16; an fp16 loss scale
    would come too late (`Config.lm_loss_fusable`: not under fp16). Unlike liger's own `fused_linear_cross_entropy`
    (0.8: `.item()` on the label count in its forward, `torch.equal` on the incoming gradient in its backward), the
    loop makes no host sync."""
    global fused_lm_loss_calls
    fused_lm_loss_calls += 1
    loss, predicted = _FusedLinearCrossEntropy.apply(x, weight[:vocab_size],
                                                     None if bias is None else bias[:vocab_size], labels)
    return loss, ((predicted == labels) & (labels != -100)).sum()


def fused_chunk_rows(rows: int, hidden: int, vocab: int, element_bytes: int) -> int:
    """Rows of logits the fused loss makes at a time: as many as FUSED_CHUNK_BYTES hold, or as liger sizes a chunk
    (its logits about as large as the input) where that is more. Liger's sizing alone cut BERT-base's 600 masked
    tokens of a micro-batch into 39 chunks of 16 rows, whose launches cost more host time than the loss took on the
    GPU (+52 ms a step on an H200); one 37 MB chunk does the same work."""
    from triton import cdiv, next_power_of_2

    liger = min(rows, next_power_of_2(cdiv(rows, cdiv(vocab, hidden))))
    return min(rows, max(liger, FUSED_CHUNK_BYTES // (vocab * element_bytes)))


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of x @ weight.T + bias, a chunk of rows at a time (`fused_chunk_rows`), gradients
    computed in the forward pass and scaled by the incoming one in the backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, labels):
        from liger_kernel.ops.cross_entropy import liger_cross_entropy_kernel
        from triton import next_power_of_2

        rows, hidden = x.shape
        vocab = weight.shape[0]
        chunk = fused_chunk_rows(rows, hidden, vocab, weight.element_size())
        grad_x = torch.zeros_like(x)
        grad_w = torch.zeros_like(weight, dtype=torch.float32)
        grad_b = None if bias is None else torch.zeros_like(bias, dtype=torch.float32)
        loss = torch.zeros(rows, dtype=torch.float32, device=x.device)
        predicted = torch.full((rows,), -1, dtype=torch.int64, device=x.device)
        for start in range(0, rows, chunk):
            end = min(start + chunk, rows)
            x_chunk = x[start:end]
            logits = torch.mm(x_chunk, weight.t()) if bias is None else torch.addmm(bias, x_chunk, weight.t())
            target = labels[start:end].contiguous()
            # the loss, the argmax and, in place of the logits, their gradient (softmax - one-hot; 0 where ignored)
            liger_cross_entropy_kernel[(end - start,)](
                X_ptr=logits, X_stride=logits.stride(-2), Y_ptr=target, Y_stride=target.stride(-1), weight_ptr=None,
                loss_ptr=loss[start:end], z_loss_ptr=None, loss_stride=1, token_accuracy_ptr=None,
                token_accuracy_stride=0, predicted_tokens_ptr=predicted[start:end], predicted_tokens_stride=1,
                n_cols=vocab, n_non_ignore=1, sum_non_ignore_weight=1, weight_sum=0.0, ignore_index=-100,
                lse_square_scale=0.0, label_smoothing=0.0, reduction="sum", softcap=None, RETURN_Z_LOSS=False,
                RETURN_TOKEN_ACCURACY=False, RETURN_PREDICTED_TOKENS=True, HAS_WEIGHT=False, HAS_SOFTCAPPING=False,
                HAS_GRADIENTS=True, BLOCK_SIZE=min(_FUSED_BLOCK, next_power_of_2(vocab)),
                num_warps=32 if x.is_cuda else 4)
            torch.mm(logits, weight, out=grad_x[start:end])
            _add_product(grad_w, logits.t(), x_chunk)
            if grad_b is not None:
                grad_b += logits.sum(0, dtype=torch.float32)
        ctx.save_for_backward(grad_x, grad_w.to(weight.dtype), None if grad_b is None else grad_b.to(bias.dtype))
        ctx.mark_non_differentiable(predicted)
        return loss.sum(), predicted

    @staticmethod
    def backward(ctx, grad_loss, _):
        grad_x, grad_w, grad_b = ctx.saved_tensors
        return (grad_x * grad_loss.to(grad_x.dtype), grad_w * grad_loss.to(grad_w.dtype),
                None if grad_b is None else grad_b * grad_loss.to(grad_b.dtype), None)


_FUSED_BLOCK = 65536 // 2  # the largest vocabulary block liger's kernel takes in one program (its MAX_FUSED_SIZE)


def _add_product(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out (fp32) += a @ b, the product of half-precision factors accumulated in fp32 by the GEMM itself where it can
    (Ampere and later), else computed in their dtype and added in fp32."""
    if a.dtype == out.dtype:
        out.addmm_(a, b)
    elif a.is_cuda and torch.cuda.get_device_capability(a.device)[0] >= 8:
        torch.addmm(out, a, b, out_dtype=torch.float32, out=out)
    else:
        out += torch.mm(a, b).float()


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


def attention(cfg, device: torch.device, mask: str = "padding") -> str:
    """The kernel that torch SDPA picks on `device` for this run's training attention, asked of SDPA itself
    (`torch._fused_sdp_choice`, which `F.scaled_dot_product_attention` consults) with the model's dtype, head size,
    dropout and mask: BERT-like models pass a padding mask (block-diagonal when unpadded), which flash takes none of,
    or the mask their objective names (`Objective.attention_mask`: UniLM's per-token spans); GPT-2 none (causal).
    Local layers (`model.attention_layers`) pass their band as a mask, joined with any other, and are named apart.
    A position encoding SDPA cannot compute (NEZHA's, Transformer-XL's) names ptm's own kernel instead."""
    from torch.nn.attention import SDPBackend

    m = cfg.model
    if m.positional.kernel:
        return m.positional.kernel
    s, dtype = cfg.data.seq_len, {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.precision]
    q = torch.zeros(1, m.num_heads // cfg.parallel.tp, s, m.head_size, dtype=dtype, device=device)

    def picked(bias, causal: bool) -> str:
        choice = SDPBackend(torch._fused_sdp_choice(q, q, q, bias, m.attention_dropout, causal))
        return "torch SDPA " + {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "memory-efficient",
                                SDPBackend.CUDNN_ATTENTION: "cuDNN"}.get(choice, choice.name.lower())

    mask = None if m.causal else "block-diagonal" if cfg.data.unpadded else mask
    bias = None if mask is None else q.new_zeros(1, 1, 1 if mask == "padding" else s, s)  # SDPA's form of a bool mask
    line = f"{picked(bias, m.causal)} ({f'{mask} mask' if mask else 'causal, no mask'})"
    if "local" not in m.attention_layers:
        return line
    band = f"{picked(q.new_zeros(1, 1, s, s), False)} (band{f' and {mask}' if mask else ''} mask)"  # no is_causal
    return band if "global" not in m.attention_layers else f"{line}; local layers {band}"


def describe(cfg, kernels: str, fused_lm_loss: bool, optimizer, device: torch.device, mask: str = "padding") -> str:
    """One line naming the implementation of each kernel, for the training log; `mask`: the attention mask the
    objective gives a bidirectional model (`Objective.attention_mask`)."""
    if fused_lm_loss:
        loss = "fused linear cross-entropy (liger-kernel's Triton kernel, fp32 gradient sums, no host sync)"
    else:
        loss = "megatron-core vocab-parallel cross-entropy" + (
            " (not fused under fp16: liger-kernel computes its gradients before the loss scale)"
            if cfg.precision == "fp16" and cfg.fused_lm_loss == "auto" else "")
    blocks = "torch.compile (Inductor)" if kernels == "compile" else "eager"
    family = families.get(cfg.model.arch)
    cores = attention(cfg, device, mask) if family.attends else f"none ({family.help})"
    return (f"blocks {blocks}; attention {cores}; LM head {loss}; "
            f"{type(optimizer).__name__} {optimizer.implementation}")
