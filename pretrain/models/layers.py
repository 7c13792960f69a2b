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
from megatron.core.utils import get_pg_size
from torch import nn

from pretrain import kernels as K
from pretrain.models.config import embedding_width, normalises_embeddings
from pretrain.parallel import mcore


class _OneRankFast:
    """With one TP rank, a megatron-core parallel linear layer runs eager as a plain `F.linear`: its own forward
    (argument checks, region copies, the autograd Function `LinearWithGradAccumulationAndAsyncCommunication`) does
    nothing more there, and costs host time on every call (~8 ms a step at BERT-large on an H200). Same weights, init
    and names. A compiled block keeps megatron-core's path: Inductor leaves no per-call Python to save, and a plain
    linear in a compiled encoder-decoder with activation checkpointing trips AOTAutograd's view replay (torch 2.13,
    tests/test_compiled.py)."""

    def _one_rank(self) -> bool:
        return get_pg_size(self.tp_group) == 1 and not self.sequence_parallel

    def forward(self, input_, *args, **kwargs):
        if not (args or kwargs) and self.alone and not torch.compiler.is_compiling():
            if self.skip_bias_add:
                return F.linear(input_, self.weight), self.bias
            return F.linear(input_, self.weight, self.bias), None
        return super().forward(input_, *args, **kwargs)


class ColumnParallelLinear(_OneRankFast, mtp.ColumnParallelLinear):
    """megatron-core's (fast with one TP rank: `_OneRankFast`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.alone = self._one_rank()


class RowParallelLinear(_OneRankFast, mtp.RowParallelLinear):
    """megatron-core's (fast with one TP rank: `_OneRankFast`), handing its own TP group to the matmul: 0.16 hands it
    None, which warns on every call on rank 0, and that warning is a graph break in every compiled block (two per
    block, tests/test_compiled.py)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.alone = self._one_rank()

    def _forward_impl(self, input, weight, *args, tp_group=None, **kwargs):
        return super()._forward_impl(input, weight, *args, tp_group=self.tp_group if tp_group is None else tp_group,
                                     **kwargs)


@dataclass
class Context:
    """What every layer of one model is built with: its config, its TP group, megatron-core's layer settings for that
    group, and the weight initialisations by role (`inits`: word, qkv, q, kv, out, fc1, fc2, bias; residual output
    projections may be scaled down, GPT-2's scaled_init)."""

    cfg: object
    tp: object
    mp: object
    inits: dict

    @classmethod
    def of(cls, cfg, tp) -> "Context":
        return cls(cfg, tp, mcore.model_parallel_config(tp), INITS[cfg.init](cfg))


def normal(std):
    return lambda w: nn.init.normal_(w, mean=0.0, std=std)


def normal_inits(cfg) -> dict:
    """Every weight N(0, init_std); residual output projections N(0, init_std / sqrt(2 * layers)) with GPT-2's
    scaled_init."""
    init = normal(cfg.init_std)
    out_init = normal(cfg.init_std / math.sqrt(2 * cfg.num_layers)) if cfg.scaled_init else init
    return dict.fromkeys(("word", "qkv", "q", "kv", "fc1", "bias"), init) | {"out": out_init, "fc2": out_init}


def t5_inits(cfg) -> dict:
    """T5's (Mesh TensorFlow's) initialisation: the word embeddings N(0, 1); a query (d * d_head)^-1/2 (it stands in for
    the attention's missing 1/sqrt(d_head)), keys, values, the MLP's input and the bias tables d^-1/2, the attention
    output (heads * d_head)^-1/2 and the MLP output f^-1/2, with d the hidden size and f the MLP width. The fused QKV
    weight is whole when it is drawn (CPU initialisation): its query rows, per head [q, k, v], are scaled."""
    d, f, head, width = cfg.hidden_size, cfg.ffn_hidden_size, cfg.head_size, cfg.attention_width

    def qkv(w):
        nn.init.normal_(w, std=d ** -0.5)
        with torch.no_grad():
            w.view(-1, 3, head, w.shape[-1])[:, 0] *= head ** -0.5
        return w
    return {"word": normal(1.0), "qkv": qkv, "q": normal((d * head) ** -0.5), "kv": normal(d ** -0.5),
            "out": normal(width ** -0.5), "fc1": normal(d ** -0.5), "fc2": normal(f ** -0.5), "bias": normal(d ** -0.5)}


INITS = {"normal": normal_inits, "t5": t5_inits}  # model.init: the weight initialisations by role


class Embeddings(nn.Module):
    """Word (vocab-parallel), position (absolute: learned, or RoBERTa's from the padding id), segment and ERNIE 2.0
    task-type embeddings summed, normalised with `embedding_norm` (BERT's post-LN models); a width below the hidden
    size is projected up (ALBERT's factorisation)."""

    def __init__(self, ctx: Context):
        super().__init__()
        cfg, e = ctx.cfg, embedding_width(ctx.cfg)
        self.word = mtp.VocabParallelEmbedding(cfg.padded_vocab, e, init_method=ctx.inits["word"], config=ctx.mp,
                                               tp_group=ctx.tp)
        self.position = nn.Embedding(cfg.max_position_embeddings, e) if cfg.positional.table else None
        self.token_type = nn.Embedding(cfg.type_vocab_size, e) if cfg.type_vocab_size else None
        self.task_type = nn.Embedding(cfg.task_type_vocab_size, e) if cfg.task_type_vocab_size else None
        self.norm = nn.LayerNorm(e, eps=cfg.layer_norm_eps) if normalises_embeddings(cfg) else None
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        self.proj = nn.Linear(e, cfg.hidden_size) if e != cfg.hidden_size else None
        self.pad = cfg.pad_token_id if cfg.positional.from_pad else None
        self.offset = cfg.position_offset

    def share(self, other: "Embeddings", names=("word", "position", "token_type", "task_type", "norm")) -> None:
        """Use `other`'s tables and LayerNorm (ELECTRA's generator reads the discriminator's; a decoder its encoder's
        word table) without owning them: their parameters exist once; this module keeps the rest."""
        for name in names:
            if self._modules.pop(name, None) is not None:
                object.__setattr__(self, name, getattr(other, name))

    def forward(self, input_ids, token_type_ids=None, task_type_ids=None, position_ids=None):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)
        if self.pad is not None:
            position_ids = torch.where(input_ids == self.pad, self.pad, position_ids + self.pad + 1)
        elif self.offset:
            position_ids = position_ids + self.offset
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

class Record:
    """Tensors that modules append to as they run (each layer's attention scores), carried in their arguments. Not a
    list: DeepSpeed's ZeRO-3 hooks copy the lists, tuples and dicts among a module's arguments, so what the module
    appended to one would land in the copy."""

    def __init__(self):
        self.tensors: list = []

    def append(self, x) -> None:
        self.tensors.append(x)


class DotProductAttention(nn.Module):
    """softmax(q k^T / sqrt(d) + mask) v by torch's fused kernels (SDPA: flash, memory-efficient or cuDNN where the
    mask and dtype allow). Given a Record `scores`, it appends the scores q k^T / sqrt(d) before the mask [b, heads,
    s, s] (TinyBERT distils them; SDPA keeps none, so they are computed beside it)."""

    def __init__(self, ctx: Context, head_dim: int, causal: bool | None = None):
        super().__init__()
        self.causal = ctx.cfg.causal if causal is None else causal
        self.scale = None if ctx.cfg.scaled_attention else 1.0  # T5: unscaled scores

    def forward(self, q, k, v, mask, p: float, scores: Record | None = None):
        if scores is not None:
            scores.append(q @ k.transpose(-1, -2) * (self.scale or q.shape[-1] ** -0.5))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=self.causal,
                                              scale=self.scale)


BANDS: dict = {}  # LocalAttention's band masks by (queries, keys, window, causal, device)


class LocalAttention(DotProductAttention):
    """DotProductAttention within a band: query i attends to the keys j with i - window < j <= i when causal (GPT-3's
    locally banded layers; GPT-Neo's "local"), |i - j| < window otherwise. The band joins the mask as a boolean [s, t]
    mask (the queries are the last s of the t keys' positions: incremental decoding), so SDPA runs without is_causal."""

    def __init__(self, ctx: Context, head_dim: int, causal: bool | None = None):
        super().__init__(ctx, head_dim, causal)
        self.window = ctx.cfg.attention_window

    def band(self, s: int, t: int, device) -> torch.Tensor:
        """The [s, t] band, built once per shape and device and shared by every local layer (`BANDS`), not again in
        each layer of each step; inside a compiled graph it is built in the graph."""
        if torch.compiler.is_compiling():
            return self._band(s, t, device)
        key = (s, t, self.window, self.causal, device)
        if key not in BANDS:
            if len(BANDS) >= 8:  # incremental decoding's growing shapes: keep a few
                BANDS.clear()
            BANDS[key] = self._band(s, t, device)
        return BANDS[key]

    def _band(self, s: int, t: int, device) -> torch.Tensor:
        distance = torch.arange(t - s, t, device=device)[:, None] - torch.arange(t, device=device)  # [s, t]
        return (distance >= 0) & (distance < self.window) if self.causal else distance.abs() < self.window

    def forward(self, q, k, v, mask, p: float, scores: Record | None = None):
        band = self.band(q.shape[2], k.shape[2], q.device)
        if mask is None:
            mask = band
        elif mask.dtype == torch.bool:
            mask = mask & band
        else:  # an additive bias (T5's buckets)
            mask = mask.masked_fill(~band, torch.finfo(mask.dtype).min)
        if scores is not None:
            scores.append(q @ k.transpose(-1, -2) * (self.scale or q.shape[-1] ** -0.5))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=self.scale)


class RelativeAttention(nn.Module):
    """NEZHA's functional relative positions: the scores add q . a_ij and the output p_ij . a_ij, a_ij fixed sinusoids
    of the clipped distance (`relative_positions`); computed in plain matmuls (SDPA has no value-side term). A Record
    `scores` takes the scores before the mask, as DotProductAttention's."""

    def __init__(self, ctx: Context, head_dim: int, causal: bool | None = None):
        super().__init__()
        self.causal = ctx.cfg.causal if causal is None else causal
        self.max_distance, self.head_dim = ctx.cfg.max_relative_position, head_dim

    def forward(self, q, k, v, mask, p: float, scores: Record | None = None):
        s = q.shape[2]
        a = relative_positions(s, self.head_dim, self.max_distance, q.device).to(q.dtype)  # [s, s, d]
        x = (q @ k.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, a)) / math.sqrt(self.head_dim)
        if scores is not None:
            scores.append(x)
        if self.causal:
            x = x.masked_fill(torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), -math.inf)
        if mask is not None:
            x = x.masked_fill(~mask, torch.finfo(x.dtype).min)
        probs = F.dropout(x.float().softmax(-1).to(q.dtype), p)
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
    head as [head][q, k, v][head_dim] (Megatron's layout) so a column split keeps heads whole. `core` attends;
    `causal` overrides the config's (a decoder stack's self-attention); `scores`: a Record the core appends this
    call's attention scores to."""

    def __init__(self, ctx: Context, submodules: AttentionSubmodules, causal: bool | None = None):
        super().__init__()
        cfg, h, a = ctx.cfg, ctx.cfg.hidden_size, ctx.cfg.attention_width
        self.heads = cfg.num_heads // ctx.tp.size()
        self.head_dim = cfg.head_size
        self.dropout = cfg.attention_dropout
        self.qkv = ColumnParallelLinear(h, 3 * a, config=ctx.mp, init_method=ctx.inits["qkv"],
                                        bias=cfg.bias and cfg.qkv_bias, gather_output=False, tp_group=ctx.tp)
        self.core = build_module(submodules.core, ctx, self.head_dim, causal)
        self.out = RowParallelLinear(a, h, config=ctx.mp, init_method=ctx.inits["out"], bias=cfg.bias,
                                     input_is_parallel=True, skip_bias_add=True, tp_group=ctx.tp)

    def forward(self, x, mask, cache: dict | None = None, scores: Record | None = None):
        """`cache` (incremental decoding): this call's keys and values join those of the earlier calls."""
        b, s, _ = x.shape
        qkv, _ = self.qkv(x)
        q, k, v = qkv.view(b, s, self.heads, 3, self.head_dim).permute(3, 0, 2, 1, 4)  # 3 x [b, heads, s, d]
        if cache is not None:
            if cache:
                k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
            cache.update(k=k, v=v)
        p = self.dropout if self.training else 0.0  # (inline: a graph break one call deeper splits more graphs)
        y = on_tp_generator(self.core, q, k, v, mask, p, scores) if p else self.core(q, k, v, mask, p, scores)
        return self.out(y.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))  # (output, bias or None)


class CrossAttention(nn.Module):
    """A decoder's attention to the encoder's output `context`: queries from the decoder (column-parallel), keys and
    values from the context (one column-parallel linear laid out per head as [head][k, v][head_dim]), the row-parallel
    output; each TP rank owns num_heads / tp whole heads. Never causal."""

    def __init__(self, ctx: Context, submodules: AttentionSubmodules):
        super().__init__()
        cfg, h, a = ctx.cfg, ctx.cfg.hidden_size, ctx.cfg.attention_width
        self.heads = cfg.num_heads // ctx.tp.size()
        self.head_dim = cfg.head_size
        self.dropout = cfg.attention_dropout
        self.q = ColumnParallelLinear(h, a, config=ctx.mp, init_method=ctx.inits["q"], bias=cfg.bias and cfg.qkv_bias,
                                      gather_output=False, tp_group=ctx.tp)
        self.kv = ColumnParallelLinear(h, 2 * a, config=ctx.mp, init_method=ctx.inits["kv"],
                                       bias=cfg.bias and cfg.qkv_bias, gather_output=False, tp_group=ctx.tp)
        self.core = build_module(submodules.core, ctx, self.head_dim, False)
        self.out = RowParallelLinear(a, h, config=ctx.mp, init_method=ctx.inits["out"], bias=cfg.bias,
                                     input_is_parallel=True, skip_bias_add=True, tp_group=ctx.tp)

    def forward(self, x, context, mask, cache: dict | None = None):
        """`cache` (incremental decoding): the context's keys and values, computed at the first call."""
        (b, s, _), t = x.shape, context.shape[1]
        q = self.q(x)[0].view(b, s, self.heads, self.head_dim).transpose(1, 2)
        if cache:
            k, v = cache["k"], cache["v"]
        else:
            k, v = self.kv(context)[0].view(b, t, self.heads, 2, self.head_dim).permute(3, 0, 2, 1, 4)
            if cache is not None:
                cache.update(k=k, v=v)
        p = self.dropout if self.training else 0.0
        y = on_tp_generator(self.core, q, k, v, mask, p) if p else self.core(q, k, v, mask, p)
        return self.out(y.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


def per_head(ctx: Context, *shape: int, heads_dim: int = 0) -> nn.Parameter:
    """A parameter with a slice per head (dimension `heads_dim` of `shape` counts every head), drawn whole and cut to
    this TP rank's heads, so that any split starts from the same values."""
    whole = ctx.inits["bias"](torch.empty(*shape))
    parts, rank = ctx.tp.size(), ctx.tp.rank()
    mine = whole.narrow(heads_dim, rank * shape[heads_dim] // parts, shape[heads_dim] // parts).clone()
    p = nn.Parameter(mine)
    mtp.set_tensor_model_parallel_attributes(p, is_parallel=True, dim=heads_dim, stride=1)
    return p


class BucketedBias(nn.Module):
    """T5's relative position bias: a learned scalar per head and distance bucket, added to the attention scores of
    every layer of a stack (one table per stack). Buckets: exact distances below half of them, logarithmic up to
    `relative_max_distance`; an encoder's split by direction, a decoder's only look back. Each TP rank holds its own
    heads' columns (`per_head`)."""

    def __init__(self, ctx: Context, bidirectional: bool):
        super().__init__()
        cfg = ctx.cfg
        self.bidirectional, self.buckets = bidirectional, cfg.relative_buckets
        self.max_distance = cfg.relative_max_distance
        self.weight = per_head(ctx, cfg.relative_buckets, cfg.num_heads, heads_dim=1)

    def forward(self, queries: int, keys: int, offset: int = 0) -> torch.Tensor:
        """[1, heads, queries, keys]; the queries at positions offset, offset + 1, ... (incremental decoding)."""
        device = self.weight.device
        query = torch.arange(offset, offset + queries, device=device)
        distance = torch.arange(keys, device=device)[None, :] - query[:, None]
        return self.weight[relative_bucket(distance, self.bidirectional, self.buckets, self.max_distance)
                           ].permute(2, 0, 1)[None]


def relative_bucket(distance, bidirectional: bool, buckets: int, max_distance: int):
    """T5's bucket of each key-minus-query distance (Mesh TensorFlow's `_relative_position_bucket`)."""
    out = torch.zeros_like(distance)
    if bidirectional:
        buckets //= 2
        out = out + (distance > 0).long() * buckets
        distance = distance.abs()
    else:
        distance = (-distance).clamp(min=0)
    exact = buckets // 2
    large = exact + (torch.log(distance.float() / exact) / math.log(max_distance / exact) * (buckets - exact)).long()
    return out + torch.where(distance < exact, distance, large.clamp(max=buckets - 1))


@torch.compiler.disable
def on_tp_generator(fn, *args):
    """fn(*args) drawing its dropout from this rank's tensor-parallel generator (the RNG tracker's fork: dropout on
    this rank's heads). Eager even inside a compiled block, so that no compiled graph switches generators
    (`model.checkpoint` says why that matters)."""
    with mcore.rng_tracker().fork():
        return fn(*args)


# ---- MLP and block --------------------------------------------------------------------------------------------

class MLP(nn.Module):
    """fc1 (column-parallel) + activation + fc2 (row-parallel); gated (T5 1.1): act(fc1) * gate, the gate a second
    column-parallel projection."""

    def __init__(self, ctx: Context):
        super().__init__()
        cfg = ctx.cfg
        self.activation = cfg.activation

        def column():
            return ColumnParallelLinear(cfg.hidden_size, cfg.ffn_hidden_size, config=ctx.mp,
                                            init_method=ctx.inits["fc1"],
                                            bias=cfg.bias, gather_output=False, skip_bias_add=True, tp_group=ctx.tp)
        self.fc1 = column()
        self.gate = column() if cfg.gated_mlp else None
        self.fc2 = RowParallelLinear(cfg.ffn_hidden_size, cfg.hidden_size, config=ctx.mp, init_method=ctx.inits["fc2"],
                                     bias=cfg.bias, input_is_parallel=True, skip_bias_add=True, tp_group=ctx.tp)

    def forward(self, x):
        h = K.bias_act(*self.fc1(x), self.activation)
        if self.gate is not None:
            g, bias = self.gate(x)
            h = h * (g if bias is None else g + bias)
        return self.fc2(h)  # (output, bias: None without biases)


def norm(cfg, width: int | None = None) -> nn.Module:
    """The config's normalisation over `width` (default: the hidden size): LayerNorm, or T5's RMSNorm (scale only)."""
    width = width or cfg.hidden_size
    return nn.RMSNorm(width, eps=cfg.layer_norm_eps) if cfg.norm_type == "rmsnorm" else \
        nn.LayerNorm(width, eps=cfg.layer_norm_eps)


@dataclass
class BlockSubmodules:
    attention: ModuleSpec | type = SelfAttention
    mlp: ModuleSpec | type = MLP
    cross_attention: ModuleSpec | type | None = None  # a decoder's attention to the encoder's output


class Block(nn.Module):
    """A transformer layer, post-LN or pre-LN, of an attention, an optional cross-attention (to `context`, under
    `context_mask`) and an MLP submodule. `shared`: an attention or MLP module that the model owns and other blocks
    call too (ALBERT); the block uses it without registering it, so its parameters exist once."""

    def __init__(self, ctx: Context, submodules: BlockSubmodules, pre_ln: bool, shared: dict | None = None):
        super().__init__()
        cfg, shared = ctx.cfg, shared or {}
        self.pre_ln = pre_ln
        self.attn_norm = norm(cfg)
        self.mlp_norm = norm(cfg)
        for name in ("attn", "mlp"):
            if name in shared:
                object.__setattr__(self, name, shared[name])
            else:
                setattr(self, name, build_module(submodules.attention if name == "attn" else submodules.mlp, ctx))
        if submodules.cross_attention is not None:
            self.cross_norm = norm(cfg)
            self.cross = build_module(submodules.cross_attention, ctx)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, x, mask, context=None, context_mask=None, cache: dict | None = None,
                scores: Record | None = None):
        """`cache` (incremental decoding): {"self": {}, "cross": {}} that the attentions fill and reuse; `scores`: a
        Record the self-attention appends its scores to (`DotProductAttention`)."""
        attend = {} if cache is None else {"cache": cache["self"]}
        if scores is not None:
            attend["scores"] = scores
        crossed = {} if cache is None else {"cache": cache["cross"]}
        if self.pre_ln:
            x = x + self._out(*self.attn(self.attn_norm(x), mask, **attend))
            if context is not None:
                x = x + self._out(*self.cross(self.cross_norm(x), context, context_mask, **crossed))
            return x + self._out(*self.mlp(self.mlp_norm(x)))
        x = self._post(self.attn(x, mask, **attend), self.attn_norm, x)
        if context is not None:
            x = self._post(self.cross(x, context, context_mask, **crossed), self.cross_norm, x)
        return self._post(self.mlp(x), self.mlp_norm, x)

    def _out(self, y, bias):
        return self.dropout(y if bias is None else y + bias)

    def _post(self, out, norm: nn.LayerNorm, x):
        """LayerNorm(dropout(sublayer output) + x), the fused residual + LayerNorm."""
        return K.layer_norm(self._out(*out), norm.weight, norm.bias, norm.eps, x)


def attention_spec(cfg, causal: bool | None = None, layer: int = 0) -> ModuleSpec:
    """Self-attention of layer `layer` with the core the position encoding and the layer's attention need: NEZHA's
    relative terms, a local layer's band (`model.attention_layers`), else torch's SDPA (T5's bucketed bias comes in
    the mask)."""
    core = RelativeAttention if cfg.positional.pair_terms else \
        LocalAttention if cfg.attention(layer) == "local" else DotProductAttention
    return ModuleSpec(SelfAttention, params={"causal": causal}, submodules=AttentionSubmodules(core=core))


def block_spec(cfg, decoder: bool = False, layer: int = 0) -> ModuleSpec:
    """The block the model's features make for layer `layer` of its stack: the LayerNorm's place, the attention's
    core, the MLP; a decoder's (of an encoder-decoder) also attends to the encoder's output."""
    cross = ModuleSpec(CrossAttention, submodules=AttentionSubmodules(core=DotProductAttention)) if decoder else None
    return ModuleSpec(Block, params={"pre_ln": cfg.norm == "pre"},
                      submodules=BlockSubmodules(attention=attention_spec(cfg, None, layer), mlp=MLP,
                                                 cross_attention=cross))

# ---- what every model shares around its blocks: initialisation, the tied output projection, added heads --------

def init_replicated(model: nn.Module, std: float) -> None:
    """Layers outside megatron-core (replicated on every TP rank) as BERT/GPT-2 initialise them."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=std)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    for m in model.modules():
        if isinstance(m, (mtp.ColumnParallelLinear, mtp.RowParallelLinear)) and m.bias is not None:
            with torch.no_grad():
                m.bias.zero_()


def tied_logits(h, word: mtp.VocabParallelEmbedding, tp):
    """h @ word_embeddings.T for this rank's vocabulary slice; the input's gradient is summed over TP group `tp`."""
    return F.linear(mtp.copy_to_tensor_model_parallel_region(h, group=tp), word.weight)


def vocab_padding(cfg, tp) -> torch.Tensor:
    """True at this TP rank's rows of the padded vocabulary (model.vocab_pad_to) past model.vocab_size."""
    rows = cfg.padded_vocab // tp.size()
    return torch.arange(tp.rank() * rows, (tp.rank() + 1) * rows) >= cfg.vocab_size


def mask_padding(logits: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """Vocab-parallel logits with the padding rows' (`vocab_padding`) at the dtype's lowest value: never predicted."""
    return logits.masked_fill(padding, torch.finfo(logits.dtype).min)


def add_heads(model: nn.Module, heads) -> tuple[str, ...]:
    """Add the heads an objective gives ({attribute: module}, or a function making them, called here: last, so that
    their initial draws follow the model's; they initialise themselves) to `model`; their names."""
    added = heads() if callable(heads) else heads or {}
    for name, head in added.items():
        model.add_module(name, head)
    return tuple(added)
