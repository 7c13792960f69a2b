"""XLNet (Yang et al. 2019) and its Transformer-XL core (Dai et al. 2019), read top to bottom: word embeddings, post-LN
blocks of two-stream relative attention and an MLP, a memory of the previous segment, and the tied LM head with a bias.

    position_encoding  transformer_xl: no position table; each layer projects sinusoids of the query-key distance
                       (clamped at `clamp_len`) and scores (q + u) k + (q + v) r, u and v learned per head
    relative_segments  XLNet's segment term: (q + s) e_same or e_different, learned per head
    causal             attend to the memory and earlier tokens only (Transformer-XL); XLNet: both directions
    mem_len            each layer also attends to the last mem_len inputs it had (the previous segments', detached;
                       reuse_len: only the first reuse_len positions of each segment are kept, XLNet's)

Two streams: the content stream `h` starts from the word embeddings and sees its own token; the query stream `g`
starts from one learned vector at each predicted position (`targets`) and sees only what `perm_mask` lets the
position see, never its own token. Both run through the same weights, as one sequence of queries (the query
stream's rows after the content stream's), so a layer's kernels launch once for both; the LM head reads the query
stream where there is one. Shapes are batch first ([b, s, hidden]), as everywhere in ptm; heads are split over the
TP ranks (q, k, v, r, the output, and u, v, s and the segment vectors by head), the vocabulary too.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel as mtp
from torch import nn

from pretrain import kernels as K
from pretrain.models.layers import (MLP, ColumnParallelLinear, Context, Embeddings, RowParallelLinear, add_heads,
                                     init_replicated, mask_padding, on_tp_generator, per_head, tied_logits,
                                     vocab_padding)
from pretrain.models.recompute import checkpoint, checkpointed_layers
from pretrain.parallel import mcore


def sinusoids(positions: torch.Tensor, width: int) -> torch.Tensor:
    """Transformer-XL's position vectors [len(positions), width]: sines then cosines of position / 10000^(2k/width)."""
    inverse = 1 / torch.pow(10000, torch.arange(0, width, 2, device=positions.device).float() / width)
    angle = positions.float()[:, None] * inverse
    return torch.cat([angle.sin(), angle.cos()], -1)


class TwoStreamAttention(nn.Module):
    """Relative multi-head attention with XLNet's content, position and segment terms; keys and values from the
    memory and the content stream; queries from either stream."""

    def __init__(self, ctx: Context):
        super().__init__()
        cfg, h, a = ctx.cfg, ctx.cfg.hidden_size, ctx.cfg.attention_width
        self.heads, self.head_dim = cfg.num_heads // ctx.tp.size(), cfg.head_size
        self.dropout, self.scale = cfg.attention_dropout, 1 / math.sqrt(cfg.head_size)

        def column(width, role):
            return ColumnParallelLinear(h, width, config=ctx.mp, init_method=ctx.inits[role], bias=False,
                                            gather_output=False, tp_group=ctx.tp)
        self.q, self.kv, self.r = column(a, "q"), column(2 * a, "kv"), column(a, "q")  # kv: per head [k, v]
        self.out = RowParallelLinear(a, h, config=ctx.mp, init_method=ctx.inits["out"], bias=False,
                                     input_is_parallel=True, skip_bias_add=True, tp_group=ctx.tp)
        self.content_bias = per_head(ctx, cfg.num_heads, self.head_dim)  # u (HF r_w_bias)
        self.position_bias = per_head(ctx, cfg.num_heads, self.head_dim)  # v (HF r_r_bias)
        if cfg.relative_segments:
            self.segment_bias = per_head(ctx, cfg.num_heads, self.head_dim)  # s (HF r_s_bias)
            self.segments = per_head(ctx, 2, cfg.num_heads, self.head_dim, heads_dim=1)  # same, different

    def keys(self, context, positions):
        """Keys and values [b, heads, k, d] of the memory + content stream `context`, and the position keys [heads,
        R, d] of the relative position vectors `positions` [R, hidden]."""
        b, k = context.shape[:2]
        key, value = self.kv(context)[0].view(b, k, self.heads, 2, self.head_dim).permute(3, 0, 2, 1, 4)
        return key, value, self.r(positions)[0].view(-1, self.heads, self.head_dim).transpose(0, 1)

    def forward(self, x, keys, where, attend, different):
        """Queries from `x` [b, m, hidden] at sequence positions `where` ([b or 1, m, k]: each query's index into
        the position keys for each key), under `attend` ([b, m, k] True where a query sees a key, or None) and
        `different` ([b, m, k] True where a key is in another segment, or None); (output, None) as megatron's."""
        b, m = x.shape[:2]
        q = self.q(x)[0].view(b, m, self.heads, self.head_dim).transpose(1, 2)
        p = self.dropout if self.training else 0.0
        args = (q, *keys, where, attend, different, p)
        y = on_tp_generator(self._attend, *args) if p else self._attend(*args)
        return self.out(y.transpose(1, 2).reshape(b, m, self.heads * self.head_dim))

    def _attend(self, q, key, value, position_keys, where, attend, different, p):
        scores = (q + self.content_bias[:, None]) @ key.transpose(-1, -2)
        by_distance = (q + self.position_bias[:, None]) @ position_keys.transpose(-1, -2)  # [b, heads, m, R]
        scores = scores + by_distance.gather(-1, where[:, None].expand(q.shape[0], self.heads, -1, -1))
        if different is not None:
            by_segment = (q + self.segment_bias[:, None]) @ self.segments.permute(1, 2, 0)  # [b, heads, m, 2]
            scores = scores + torch.where(different[:, None], by_segment[..., 1:], by_segment[..., :1])
        scores = scores * self.scale
        if attend is not None:
            scores = scores.masked_fill(~attend[:, None], torch.finfo(scores.dtype).min)
        probs = F.dropout(scores.float().softmax(-1).to(q.dtype), p)
        return probs @ value


class TwoStreamBlock(nn.Module):
    """Post-LN: each stream's attention output is added to it and normalised, then the MLP likewise; one set of
    weights for both streams."""

    def __init__(self, ctx: Context):
        super().__init__()
        cfg = ctx.cfg
        self.attn, self.attn_norm = TwoStreamAttention(ctx), nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp, self.mlp_norm = MLP(ctx), nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, h, g, memory, positions, masks: tuple):
        """`masks`: (where, attend, different) of the content stream's queries followed by the query stream's (`g`'s
        rows, if any): both streams run as one sequence of queries over the same keys, so each layer launches its
        kernels once, not once per stream."""
        keys = self.attn.keys(h if memory is None else torch.cat([memory, h], 1), positions)
        x = h if g is None else torch.cat([h, g], 1)
        x = self._post(self.attn(x, keys, *masks), self.attn_norm, x)
        x = self._post(self.mlp(x), self.mlp_norm, x)
        return (x, None) if g is None else x.split([h.shape[1], g.shape[1]], 1)

    def _post(self, out, norm: nn.LayerNorm, x):
        y, bias = out
        return K.layer_norm(self.dropout(y if bias is None else y + bias), norm.weight, norm.bias, norm.eps, x)


class XLNet(nn.Module):
    """XLNet / Transformer-XL over TP group `tp`; `heads`: as `Pretraining`'s (an objective's own modules)."""

    def __init__(self, cfg, heads: dict[str, nn.Module] | None = None, tp=None):
        super().__init__()
        self.cfg, self.tp = cfg, tp or mcore.tp_group()
        ctx = Context.of(cfg, self.tp)
        self.embeddings = Embeddings(ctx)
        self.query_start = nn.Parameter(torch.empty(cfg.hidden_size))  # the query stream's input (HF mask_emb)
        self.blocks = nn.ModuleList(TwoStreamBlock(ctx) for _ in range(cfg.num_layers))
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        vocab, parts = cfg.padded_vocab, self.tp.size()
        self.lm_bias = nn.Parameter(torch.zeros(vocab // parts))
        mtp.set_tensor_model_parallel_attributes(self.lm_bias, is_parallel=True, dim=0, stride=1)
        self.checkpointed = checkpointed_layers(cfg.activation_checkpointing, cfg.num_layers)
        init_replicated(self, cfg.init_std)
        nn.init.normal_(self.query_start, std=cfg.init_std)
        self.register_buffer("vocab_padding", vocab_padding(cfg, self.tp), persistent=False)
        add_heads(self, heads)

    def encode(self, input_ids, attention_mask=None, token_type_ids=None, perm_mask=None, targets=None,
               memory=None, memory_mask=None):
        """(content stream [b, s, hidden], query stream at `targets` [b, m, hidden] or None, the next memory: per
        layer its input (the first reuse_len positions, or all), appended to `memory` (per layer [b, mem, hidden])
        and cut to mem_len, detached, and its mask). `perm_mask` [b, s, s]: True where position i may not see
        position j (XLNet's factorisation order); `targets` [b, m]: the positions the query stream predicts;
        `attention_mask` [b, s]: 1 at real tokens; `memory_mask` [b, mem]: True at memory positions that hold a
        state (a memory of fixed size filling up: `memory` None is zeros of that size)."""
        cfg, (b, s) = self.cfg, input_ids.shape
        if memory is None and memory_mask is not None:
            memory = torch.zeros((), dtype=self.embeddings.word.weight.dtype, device=input_ids.device).expand(
                cfg.num_layers, b, memory_mask.shape[1], cfg.hidden_size)
        mem = 0 if memory is None else memory[0].shape[1]
        k, device = mem + s, input_ids.device
        distance = torch.arange(k, -s, -1, device=device)  # position key r: the distance k - r
        if cfg.clamp_len > 0:
            distance = distance.clamp(-cfg.clamp_len, cfg.clamp_len)
        positions = self.dropout(sinusoids(distance, cfg.hidden_size).to(self.embeddings.word.weight.dtype))
        blocked = torch.zeros(b, s, k, dtype=torch.bool, device=device)  # True: hidden from the query (HF's mask)
        if cfg.causal:
            blocked |= torch.ones(s, k, dtype=torch.bool, device=device).triu(mem + 1)
        if attention_mask is not None:
            blocked[..., mem:] |= ~attention_mask.bool()[:, None, :]
        if perm_mask is not None:
            blocked[..., mem:] |= perm_mask.bool()
        if memory_mask is not None:
            blocked[..., :mem] |= ~memory_mask[:, None, :]
        rows = torch.arange(s, device=device)
        own = torch.arange(k, device=device) == (rows + mem)[:, None]  # the content stream sees its own token
        masked = cfg.causal or attention_mask is not None or perm_mask is not None or memory_mask is not None
        different = None
        if cfg.relative_segments and token_type_ids is not None:
            keys = token_type_ids if not mem else F.pad(token_type_ids, (mem, 0))
            different = token_type_ids[:, :, None] != keys[:, None, :]
        where, attend = (s - rows)[None, :, None] + torch.arange(k, device=device), ~blocked | own if masked else None
        h, g = self.embeddings(input_ids), None
        if targets is not None:  # the query stream's rows after the content stream's (TwoStreamBlock)
            pick = targets[..., None].expand(-1, -1, k)
            where = torch.cat([where.expand(b, -1, -1), (s - targets)[..., None] + torch.arange(k, device=device)], 1)
            attend = None if attend is None else torch.cat([attend, ~blocked.gather(1, pick)], 1)
            different = None if different is None else torch.cat([different, different.gather(1, pick)], 1)
            g = self.dropout(self.query_start.expand(b, targets.shape[1], -1).contiguous())
        masks = (where, attend, different)
        following, kept = [], slice(None, cfg.reuse_len or None)
        for i, block in enumerate(self.blocks):
            if cfg.mem_len:
                new = h[:, kept] if memory is None else torch.cat([memory[i], h[:, kept]], 1)
                following.append(new[:, -cfg.mem_len:].detach())
            layer_memory = None if memory is None else memory[i]
            if i in self.checkpointed and self.training:
                h, g = checkpoint(block, h, g, layer_memory, positions, masks)
            else:
                h, g = block(h, g, layer_memory, positions, masks)
        following_mask = None if memory_mask is None or not cfg.mem_len else torch.cat(
            [memory_mask, memory_mask.new_ones(b, h[:, kept].shape[1])], 1)[:, -cfg.mem_len:]
        return h, g, following or None, following_mask

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, *, perm_mask=None, targets=None,
                memory=None, memory_mask=None, positions=None, labels=None, hidden=False):
        """{"logits"} (vocab-parallel) of the query stream, or of the content stream at `positions` (flat indices)
        where there is none, and "memory" and "memory_mask" (`encode`'s); with `labels` {"lm_loss": (summed loss,
        correct)} from the fused linear cross-entropy; with `hidden` the streams' states."""
        h, g, following, following_mask = self.encode(input_ids, attention_mask, token_type_ids, perm_mask, targets,
                                                      memory, memory_mask)
        out = {"memory": following, "memory_mask": following_mask}
        if hidden:
            return {**out, "hidden": h, "query_hidden": g}
        predicted = g if g is not None else h if positions is None else h.flatten(0, 1)[positions.flatten()]
        predicted = self.dropout(predicted)
        if labels is not None:
            return {**out, "lm_loss": K.linear_cross_entropy(predicted.flatten(0, -2), self.embeddings.word.weight,
                                                             self.lm_bias, labels.flatten(), self.cfg.vocab_size)}
        return {**out, "logits": self.lm_logits(predicted)}

    def lm_logits(self, h):
        """Vocab-parallel logits (tied word embeddings plus the bias), padding rows masked."""
        return mask_padding(tied_logits(h, self.embeddings.word, self.tp) + self.lm_bias, self.vocab_padding)

    def external_parameters(self):
        """(module, parameter) pairs where a module reads a parameter another owns: the LM head reads the word table,
        each block passes its LayerNorms' weights to the fused residual + LayerNorm kernel."""
        yield self, self.embeddings.word.weight
        for block in self.blocks:
            for norm in (block.attn_norm, block.mlp_norm):
                yield block, norm.weight
                yield block, norm.bias
