"""The encoder-decoder of T5, BART and MASS, read top to bottom: word embeddings shared by both stacks, an encoder
stack, a decoder stack whose blocks also attend to the encoder's output (`layers.block_spec(cfg, decoder=True)`),
and the tied LM head. The features are model.py's; these are the encoder-decoder's own:

    decoder_layers     the decoder's depth (num_layers is the encoder's)
    position_encoding  bucketed: T5's relative bias, one table per stack (bidirectional in the encoder, looking back
                       in the decoder) added to every layer's attention scores; learned: a position table per stack
    norm_type, bias, gated_mlp, scaled_attention
                       T5: RMSNorm, no biases, ReLU (1.0) or gated GELU (1.1) MLPs, unscaled attention scores
    scaled_logits      the decoder's output times hidden_size**-0.5 before the tied projection (T5 1.0)

The decoder reads `decoder_input_ids` (the targets shifted right: the objective makes them) under a causal mask and
its padding; the LM head predicts `labels` at `positions`. Logits stay vocab-parallel, as in model.py.
"""
from __future__ import annotations

import torch
from megatron.core.transformer.spec_utils import build_module
from torch import nn

from pretrain import kernels as K
from pretrain.models.layers import (BucketedBias, Context, Embeddings, add_heads, block_spec, init_replicated,
                                     mask_padding, norm, tied_logits, vocab_padding)
from pretrain.models.recompute import checkpoint, checkpointed_layers
from pretrain.parallel import mcore


class Stack(nn.Module):
    """`layers` blocks (a decoder's with cross-attention), the stack's bucketed bias, and with pre-LN a final norm
    followed by dropout (T5)."""

    def __init__(self, ctx: Context, layers: int, decoder: bool):
        super().__init__()
        cfg = ctx.cfg
        self.blocks = nn.ModuleList(build_module(block_spec(cfg, decoder, i), ctx) for i in range(layers))
        self.bias = BucketedBias(ctx, bidirectional=not decoder) if cfg.positional.score_bias else None
        self.final_norm = norm(cfg) if cfg.norm == "pre" else None
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        self.checkpointed = checkpointed_layers(cfg.activation_checkpointing, layers)

    def forward(self, x, attend, context=None, context_mask=None, caches: list | None = None, offset: int = 0):
        """`attend`: [b, 1, q, k] True where a query sees a key; the bucketed bias joins it as an additive mask.
        Incremental decoding: `caches` (one per block) and the queries' first position `offset`."""
        mask = attend if self.bias is None else additive(attend, self.bias(*attend.shape[-2:], offset), x.dtype)
        for i, block in enumerate(self.blocks):
            if i in self.checkpointed and self.training:
                x = checkpoint(lambda x, m, block=block: block(x, m, context, context_mask), x, mask)
            else:
                x = block(x, mask, context, context_mask, None if caches is None else caches[i])
        return self.dropout(self.final_norm(x)) if self.final_norm is not None else x


def additive(attend, bias, dtype):
    """bias where `attend`, the dtype's lowest value elsewhere: [b, heads, q, k]."""
    return bias.to(dtype).masked_fill(~attend, torch.finfo(dtype).min)


class EncoderDecoder(nn.Module):
    """Encoder and decoder stacks over shared word embeddings, with the tied LM head, over TP group `tp`; `heads`: as
    `Pretraining`'s (an objective's own modules)."""

    def __init__(self, cfg, heads: dict[str, nn.Module] | None = None, tp=None):
        super().__init__()
        self.cfg, self.tp = cfg, tp or mcore.tp_group()
        ctx = Context.of(cfg, self.tp)
        self.embeddings = Embeddings(ctx)
        self.decoder_embeddings = Embeddings(ctx)
        self.decoder_embeddings.share(self.embeddings, names=("word",))
        self.encoder = Stack(ctx, cfg.num_layers, decoder=False)
        self.decoder = Stack(ctx, cfg.decoder_layers, decoder=True)
        init_replicated(self, cfg.init_std)
        self.register_buffer("vocab_padding", vocab_padding(cfg, self.tp), persistent=False)
        add_heads(self, heads)

    def encode(self, input_ids, attention_mask=None):
        """The encoder's output [b, s, hidden]."""
        x = self.embeddings(input_ids)
        return self.encoder(x, _padding(attention_mask, input_ids)[:, None, None, :].expand(-1, 1, x.shape[1], -1))

    def decode(self, decoder_input_ids, context, attention_mask=None, decoder_attention_mask=None):
        """The decoder's output [b, t, hidden] attending to `context` (the encoder's output) under its padding."""
        x = self.decoder_embeddings(decoder_input_ids)
        t = x.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        attend = causal & _padding(decoder_attention_mask, decoder_input_ids)[:, None, None, :]
        context_mask = _padding(attention_mask, context[..., 0])[:, None, None, :]
        return self.decoder(x, attend, context, context_mask)

    def forward(self, input_ids, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None, *,
                positions=None, labels=None, hidden=False):
        """{"logits"} of the decoder's tokens (at `positions` when given), or with `labels` {"lm_loss": (summed
        loss, correct)} from the fused linear cross-entropy; with `hidden` the decoder's states alone."""
        context = self.encode(input_ids, attention_mask)
        h = self.decode(decoder_input_ids, context, attention_mask, decoder_attention_mask)
        if hidden:
            return {"hidden": h, "encoder_hidden": context}
        predicted = h if positions is None else h.flatten(0, 1)[positions.flatten()]
        if self.cfg.scaled_logits:
            predicted = predicted * self.cfg.hidden_size ** -0.5
        if labels is None:
            return {"logits": self.lm_logits(predicted)}
        return {"lm_loss": K.linear_cross_entropy(predicted.flatten(0, -2), self.embeddings.word.weight, None,
                                                  labels.flatten(), self.cfg.vocab_size)}

    @torch.no_grad()
    def greedy(self, input_ids, attention_mask=None, *, max_new_tokens: int, start: int, eos: int | None = None,
               pad: int | None = None, scores: bool = False):
        """Greedy decoding: the encoder once, then the decoder one token at a time over cached keys and values (its
        self-attention's, and its cross-attention's of the encoder output). Tokens [b, 1 + new] from `start`; a row
        that produced `eos` continues with `pad` (default `start`); with `scores` also each step's logits [b, new,
        vocabulary]. One TP rank: the vocabulary is not split."""
        if self.tp.size() != 1:
            raise ValueError("greedy decoding runs on one tensor-parallel rank; consolidate the checkpoint first")
        context = self.encode(input_ids, attention_mask)
        context_mask = _padding(attention_mask, context[..., 0])[:, None, None, :]
        caches = [{"self": {}, "cross": {}} for _ in self.decoder.blocks]
        b, device = input_ids.shape[0], input_ids.device
        tokens = torch.full((b, 1), start, dtype=torch.long, device=device)
        done = torch.zeros(b, dtype=torch.bool, device=device)
        logits = []
        for step in range(max_new_tokens):
            x = self.decoder_embeddings(tokens[:, -1:], position_ids=torch.tensor([step], device=device))
            attend = torch.ones(b, 1, 1, step + 1, dtype=torch.bool, device=device)
            h = self.decoder(x, attend, context, context_mask, caches, offset=step)[:, -1]
            logits.append(self.lm_logits(h * self.cfg.hidden_size ** -0.5 if self.cfg.scaled_logits else h))
            chosen = logits[-1].argmax(-1)
            if eos is not None:
                chosen = chosen.masked_fill(done, start if pad is None else pad)
                done |= chosen == eos
            tokens = torch.cat([tokens, chosen[:, None]], 1)
            if eos is not None and bool(done.all()):
                break
        return (tokens, torch.stack(logits, 1)[..., :self.cfg.vocab_size]) if scores else tokens

    def lm_logits(self, h):
        """Vocab-parallel logits of (already scaled) decoder states, padding rows masked."""
        return mask_padding(tied_logits(h, self.embeddings.word, self.tp), self.vocab_padding)

    @property
    def blocks(self) -> list[nn.Module]:
        """Every transformer block, encoder's then decoder's (what `kernels.compile_model` compiles)."""
        return [*self.encoder.blocks, *self.decoder.blocks]

    def external_parameters(self):
        """(module, parameter) pairs where a module reads a parameter another owns (ZeRO-3 must gather it for the
        reader too): the decoder's embeddings and the LM head read the encoder's word table."""
        yield self.decoder_embeddings, self.embeddings.word.weight
        yield self, self.embeddings.word.weight


def _padding(mask, like):
    """[b, s] bool, True at real tokens (all True without a mask)."""
    return torch.ones_like(like, dtype=torch.bool) if mask is None else mask.bool()
