"""The layers a model is assembled from, and the spec that assembles a block from them (megatron-core's ModuleSpec):

    block_spec(cfg) = ModuleSpec(Block, submodules=BlockSubmodules(
        attention=ModuleSpec(SelfAttention, submodules=AttentionSubmodules(core=DotProductAttention | RelativeAttention)),
        mlp=MLP))

The model's features choose the submodules (`block_spec`); a layer never asks which family it is in. A new kind of
attention (cross-attention, two-stream), MLP or position term is a new submodule and a line in `block_spec`.

The linear layers and the word embeddings are megatron-core's tensor-parallel layers over the TP group passed in
(`tp`: a process group, or mcore.OneRank for a model built outside a run), so the same code runs with the weights split
over its ranks (heads and MLP columns split, vocabulary split); with one rank they are ordinary layers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel as mtp
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from torch import nn

from pretrain import kernels as K
from pretrain.models.config import embedding_width, normalises_embeddings, padded_vocab_size
from pretrain.parallel import mcore


class RowParallelLinear(mtp.RowParallelLinear):
    """megatron-core's, handing its own TP group to the matmul: 0.16 hands it None, which warns on every call on
    rank 0, and that warning is a graph break in every compiled block (two per block, tests/test_compiled.py)."""

    def _forward_impl(self, input, weight, *args, tp_group=None, **kwargs):
        return super()._forward_impl(input, weight, *args, tp_group=self.tp_group if tp_group is None else tp_group,
                                     **kwargs)


@dataclass
class Context:
    """What every layer of one model is built with: its config, its TP group, megatron-core's layer settings for that
    group, and the weight initialisations (residual output projections may be scaled down, GPT-2's scaled_init)."""

    cfg: object
    tp: object
    mp: object
    init: object
    out_init: object

    @classmethod
    def of(cls, cfg, tp) -> "Context":
        init = normal(cfg.init_std)
        out_init = normal(cfg.init_std / math.sqrt(2 * cfg.num_layers)) if cfg.scaled_init else init
        return cls(cfg, tp, mcore.model_parallel_config(tp), init, out_init)


def normal(std):
    return lambda w: nn.init.normal_(w, mean=0.0, std=std)


class Embeddings(nn.Module):
    """Word (vocab-parallel), position (absolute: learned, or RoBERTa's from the padding id), segment and ERNIE 2.0
    task-type embeddings summed, normalised with `embedding_norm` (BERT's post-LN models); a width below the hidden
    size is projected up (ALBERT's factorisation)."""

    def __init__(self, ctx: Context):
        super().__init__()
        cfg, e = ctx.cfg, embedding_width(ctx.cfg)
        self.word = mtp.VocabParallelEmbedding(padded_vocab_size(cfg), e, init_method=ctx.init, config=ctx.mp,
                                               tp_group=ctx.tp)
        self.position = nn.Embedding(cfg.max_position_embeddings, e) if cfg.position_encoding != "relative" else None
        self.token_type = nn.Embedding(cfg.type_vocab_size, e) if cfg.type_vocab_size else None
        self.task_type = nn.Embedding(cfg.task_type_vocab_size, e) if cfg.task_type_vocab_size else None
        self.norm = nn.LayerNorm(e, eps=cfg.layer_norm_eps) if normalises_embeddings(cfg) else None
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        self.proj = nn.Linear(e, cfg.hidden_size) if e != cfg.hidden_size else None
        self.pad = cfg.pad_token_id if cfg.position_encoding == "roberta" else None

    def share(self, other: "Embeddings") -> None:
        """Use `other`'s tables and LayerNorm (ELECTRA's generator reads the discriminator's) without owning them:
        their parameters exist once; this module keeps only its projection."""
        for name in ("word", "position", "token_type", "task_type", "norm"):
            if self._modules.pop(name, None) is not None:
                object.__setattr__(self, name, getattr(other, name))

    def forward(self, input_ids, token_type_ids=None, task_type_ids=None, position_ids=None):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)
        if self.pad is not None:
            position_ids = torch.where(input_ids == self.pad, self.pad, position_ids + self.pad + 1)
        x = self.word(input_ids)
        if self.position is not None:
            x = x + self.position(position_ids)
        if self.token_type is not None:
            x = x + self.token_type(token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids))
        if self.task_type is not None:
            x = x + self.task_type(task_type_ids if task_type_ids is not None else torch.zeros_like(input_ids))
        if self.norm is not None:
            x = self.norm(x)
        x = self.dropout(x)
        return self.proj(x) if self.proj is not None else x


# ---- attention ------------------------------------------------------------------------------------------------

class DotProductAttention(nn.Module):
    """softmax(q k^T / sqrt(d) + mask) v by torch's fused kernels (SDPA: flash, memory-efficient or cuDNN where the
    mask and dtype allow)."""

    def __init__(self, ctx: Context, head_dim: int):
        super().__init__()
        self.causal = ctx.cfg.causal

    def forward(self, q, k, v, mask, p: float):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=self.causal)


class RelativeAttention(nn.Module):
    """NEZHA's functional relative positions: the scores add q . a_ij and the output p_ij . a_ij, a_ij fixed sinusoids
    of the clipped distance (`relative_positions`); computed in plain matmuls (SDPA has no value-side term)."""

    def __init__(self, ctx: Context, head_dim: int):
        super().__init__()
        self.causal, self.max_distance, self.head_dim = ctx.cfg.causal, ctx.cfg.max_relative_position, head_dim

    def forward(self, q, k, v, mask, p: float):
        s = q.shape[2]
        a = relative_positions(s, self.head_dim, self.max_distance, q.device).to(q.dtype)  # [s, s, d]
        scores = (q @ k.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, a)) / math.sqrt(self.head_dim)
        if self.causal:
            scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), -math.inf)
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = F.dropout(scores.float().softmax(-1).to(q.dtype), p)
        return probs @ v + torch.einsum("bhij,ijd->bhid", probs, a)


def relative_positions(length: int, depth: int, max_distance: int, device=None) -> torch.Tensor:
    """NEZHA's functional relative position encoding [length, length, depth]: for query i and key j, sines (even
    dimensions) and cosines (odd) of (clip(j - i, +-max_distance) + max_distance) / 10000^(2k / depth), the
    clipped distance shifted to 0..2 * max_distance as NEZHA's tables index it. Nothing is learned."""
    index = torch.arange(length, device=device)
    distance = (index[None, :] - index[:, None]).clamp(-max_distance, max_distance) + max_distance
    frequency = torch.exp(torch.arange(0, depth, 2, device=device).float() * (-math.log(10000.0) / depth))
    angle = distance[..., None].float() * frequency
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2)


@dataclass
class AttentionSubmodules:
    core: type = DotProductAttention  # scores, mask, softmax, dropout and the weighted sum, given q, k, v


class SelfAttention(nn.Module):
    """Multi-head self-attention; each TP rank owns num_heads / tp whole heads. The fused QKV weight is laid out per
    head as [head][q, k, v][head_dim] (Megatron's layout) so a column split keeps heads whole. `core` attends."""

    def __init__(self, ctx: Context, submodules: AttentionSubmodules):
        super().__init__()
        cfg, h = ctx.cfg, ctx.cfg.hidden_size
        self.heads = cfg.num_heads // ctx.tp.size()
        self.head_dim = h // cfg.num_heads
        self.dropout = cfg.attention_dropout
        self.qkv = mtp.ColumnParallelLinear(h, 3 * h, config=ctx.mp, init_method=ctx.init, bias=True,
                                            gather_output=False, tp_group=ctx.tp)
        self.core = build_module(submodules.core, ctx, self.head_dim)
        self.out = RowParallelLinear(h, h, config=ctx.mp, init_method=ctx.out_init, bias=True,
                                         input_is_parallel=True, skip_bias_add=True, tp_group=ctx.tp)

    def forward(self, x, mask):
        b, s, _ = x.shape
        qkv, _ = self.qkv(x)
        q, k, v = qkv.view(b, s, self.heads, 3, self.head_dim).permute(3, 0, 2, 1, 4)  # 3 x [b, heads, s, d]
        p = self.dropout if self.training else 0.0
        y = _on_tp_generator(self.core, q, k, v, mask, p) if p else self.core(q, k, v, mask, p)
        return self.out(y.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))  # (output, bias)


@torch.compiler.disable
def _on_tp_generator(fn, *args):
    """fn(*args) drawing its dropout from this rank's tensor-parallel generator (the RNG tracker's fork: dropout on
    this rank's heads). Eager even inside a compiled block, so that no compiled graph switches generators
    (`model.checkpoint` says why that matters)."""
    with mcore.rng_tracker().fork():
        return fn(*args)


# ---- MLP and block --------------------------------------------------------------------------------------------

class MLP(nn.Module):
    """fc1 (column-parallel) + activation + fc2 (row-parallel)."""

    def __init__(self, ctx: Context):
        super().__init__()
        cfg = ctx.cfg
        self.approximate = approximation(cfg)
        self.fc1 = mtp.ColumnParallelLinear(cfg.hidden_size, cfg.ffn_hidden_size, config=ctx.mp, init_method=ctx.init,
                                            bias=True, gather_output=False, skip_bias_add=True, tp_group=ctx.tp)
        self.fc2 = RowParallelLinear(cfg.ffn_hidden_size, cfg.hidden_size, config=ctx.mp, init_method=ctx.out_init,
                                         bias=True, input_is_parallel=True, skip_bias_add=True, tp_group=ctx.tp)

    def forward(self, x):
        h, bias = self.fc1(x)
        return self.fc2(K.bias_gelu(h, bias, self.approximate))  # (output, bias)


@dataclass
class BlockSubmodules:
    attention: ModuleSpec | type = SelfAttention
    mlp: ModuleSpec | type = MLP


class Block(nn.Module):
    """A transformer layer, post-LN or pre-LN, of an attention and an MLP submodule. `shared`: an attention or MLP
    module that the model owns and other blocks call too (ALBERT); the block uses it without registering it, so its
    parameters exist once."""

    def __init__(self, ctx: Context, submodules: BlockSubmodules, pre_ln: bool, shared: dict | None = None):
        super().__init__()
        cfg, shared = ctx.cfg, shared or {}
        self.pre_ln = pre_ln
        self.attn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        for name in ("attn", "mlp"):
            if name in shared:
                object.__setattr__(self, name, shared[name])
            else:
                setattr(self, name, build_module(submodules.attention if name == "attn" else submodules.mlp, ctx))
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, x, mask):
        if self.pre_ln:
            y, bias = self.attn(self.attn_norm(x), mask)
            x = x + self.dropout(y + bias)
            y, bias = self.mlp(self.mlp_norm(x))
            return x + self.dropout(y + bias)
        y, bias = self.attn(x, mask)
        x = K.layer_norm(self.dropout(y + bias), self.attn_norm.weight, self.attn_norm.bias, self.attn_norm.eps, x)
        y, bias = self.mlp(x)
        return K.layer_norm(self.dropout(y + bias), self.mlp_norm.weight, self.mlp_norm.bias, self.mlp_norm.eps, x)


def attention_spec(cfg) -> ModuleSpec:
    """Self-attention with the core the position encoding needs: NEZHA's relative terms, else torch's SDPA."""
    core = RelativeAttention if cfg.position_encoding == "relative" else DotProductAttention
    return ModuleSpec(SelfAttention, submodules=AttentionSubmodules(core=core))


def block_spec(cfg) -> ModuleSpec:
    """The block the model's features make: the LayerNorm's place, the attention's core, the MLP."""
    return ModuleSpec(Block, params={"pre_ln": cfg.norm == "pre"},
                      submodules=BlockSubmodules(attention=attention_spec(cfg), mlp=MLP))


def approximation(cfg) -> str:
    """F.gelu's `approximate` for the config's activation."""
    return "tanh" if cfg.activation == "gelu_tanh" else "none"
