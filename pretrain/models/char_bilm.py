"""ELMo (Peters et al. 2018), as bilm-tf trains it and AllenNLP reads it.

Each word comes in as 50 character ids (pretrain/data/char_words.py); a character CNN (one Conv1d per filter width,
max-pooled over the characters, then the activation), highway layers and a projection give it a context-free vector
of `hidden_size` (P). A forward and a backward stack of `num_layers` LSTMs with a projection (cell size
`ffn_hidden_size` C, the cell clipped at `cell_clip`, the projected state at `proj_clip`) read those vectors; from the
second layer on each layer adds its input (residual). One softmax over the word vocabulary, shared by both directions,
predicts the next word from the forward stack's top and the previous word from the backward stack's.

    layers(chars)   [e|e, f1|b1, ..., fL|bL]: the representations ELMo gives downstream ([b, s, 2P] each)
    forward(chars)  {"forward", "backward"}: each stack's top [b, s, P], in the words' order
    softmax(h)      the shared softmax's vocab-parallel logits (with `labels`: the fused loss)

Gates in AllenNLP's order (input, forget, candidate, output) with one bias, on the recurrent linear; as TF's
LSTMCell, 1 is added to the forget gate when it runs (so the bias is bilm-tf's, exported as it is). Under tensor parallelism only the softmax splits
(its vocabulary rows); the CNN and the LSTMs are replicated.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel as mtp
from torch import nn

from pretrain.families.elmo import CHARS
from pretrain.models.layers import add_heads, mask_padding, vocab_padding
from pretrain.parallel import mcore

MAX_CHARS = 50  # character ids per word


class Highway(nn.Module):
    """y = t * relu(transform(x)) + (1 - t) * x with t = sigmoid(carry(x)) (bilm-tf's names)."""

    def __init__(self, width: int):
        super().__init__()
        self.transform, self.carry = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        t = torch.sigmoid(self.carry(x))
        return t * F.relu(self.transform(x)) + (1 - t) * x


class CharEncoder(nn.Module):
    """Character ids [b, s, 50] -> word vectors [b, s, P]: embedding, CNN, max-pool, activation, highways, projection."""

    def __init__(self, cfg):
        super().__init__()
        width = sum(n for _, n in cfg.char_filters)
        self.embedding = nn.Embedding(CHARS, cfg.char_embedding_size, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(cfg.char_embedding_size, n, w) for w, n in cfg.char_filters)
        self.highways = nn.ModuleList(Highway(width) for _ in range(cfg.highway_layers))
        self.projection = nn.Linear(width, cfg.hidden_size)
        self.activation = torch.tanh if cfg.activation == "tanh" else F.relu

    def forward(self, chars):
        b, s, n = chars.shape
        x = self.embedding(chars.reshape(b * s, n)).transpose(1, 2)  # [b*s, E, 50]
        h = torch.cat([self.activation(conv(x).amax(-1)) for conv in self.convs], -1)
        for highway in self.highways:
            h = highway(h)
        return self.projection(h).view(b, s, -1)


class LSTMProjection(nn.Module):
    """An LSTM whose state is a projection of its output (bilm-tf's LSTMCell with num_proj, AllenNLP's
    LstmCellWithProjection), run left to right from zero states over [b, s, inputs] -> [b, s, P]."""

    def __init__(self, inputs: int, cell: int, out: int, cell_clip: float, proj_clip: float):
        super().__init__()
        self.input = nn.Linear(inputs, 4 * cell, bias=False)
        self.state = nn.Linear(out, 4 * cell)
        self.projection = nn.Linear(cell, out, bias=False)
        self.cell_clip, self.proj_clip = cell_clip, proj_clip

    def forward(self, x):
        b, s, _ = x.shape
        gates = self.input(x)
        h = x.new_zeros(b, self.projection.out_features)
        c = x.new_zeros(b, self.projection.in_features)
        out = []
        for t in range(s):
            i, f, g, o = (gates[:, t] + self.state(h)).chunk(4, -1)
            c = torch.sigmoid(i) * torch.tanh(g) + torch.sigmoid(f + 1.0) * c
            if self.cell_clip:
                c = c.clamp(-self.cell_clip, self.cell_clip)
            h = self.projection(torch.sigmoid(o) * torch.tanh(c))
            if self.proj_clip:
                h = h.clamp(-self.proj_clip, self.proj_clip)
            out.append(h)
        return torch.stack(out, 1)


def flip(x, lengths=None):
    """Each row's first `lengths` positions in reverse order (the rest where they are): the backward stack's view."""
    if lengths is None:
        return x.flip(1)
    t = torch.arange(x.shape[1], device=x.device)
    index = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)
    return x.gather(1, index[..., None].expand_as(x))


class Softmax(nn.Module):
    """The softmax over the word vocabulary both directions share, its rows split over TP group `tp`: vocab-parallel
    logits (padding rows masked), or with `labels` (TP=1) the fused linear cross-entropy's (summed loss, correct)."""

    def __init__(self, cfg, tp):
        super().__init__()
        vocab, parts = cfg.padded_vocab, tp.size()
        self.cfg, self.tp = cfg, tp
        self.weight = nn.Parameter(torch.empty(vocab // parts, cfg.hidden_size))
        self.bias = nn.Parameter(torch.zeros(vocab // parts))
        for w in (self.weight, self.bias):
            mtp.set_tensor_model_parallel_attributes(w, is_parallel=True, dim=0, stride=1)
        self.register_buffer("vocab_padding", vocab_padding(cfg, tp), persistent=False)

    def forward(self, h, labels=None):
        if labels is not None:
            from pretrain import kernels as K

            return K.linear_cross_entropy(h, self.weight, self.bias, labels, self.cfg.vocab_size)
        logits = F.linear(mtp.copy_to_tensor_model_parallel_region(h, group=self.tp), self.weight, self.bias)
        return mask_padding(logits, self.vocab_padding)


class ELMo(nn.Module):
    """The character encoder, the two LSTM stacks and the shared softmax over TP group `tp` (its vocabulary split)."""

    def __init__(self, cfg, heads=None, tp=None):
        super().__init__()
        self.cfg, self.tp = cfg, tp or mcore.tp_group()
        p, c = cfg.hidden_size, cfg.ffn_hidden_size
        self.chars = CharEncoder(cfg)
        self.forward_lstms, self.backward_lstms = (
            nn.ModuleList(LSTMProjection(p, c, p, cfg.cell_clip, cfg.proj_clip) for _ in range(cfg.num_layers))
            for _ in range(2))
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        self.softmax = Softmax(cfg, self.tp)
        self.reset_parameters()
        add_heads(self, heads)

    def reset_parameters(self):
        """bilm-tf's initialisation: characters uniform in [-1, 1] (the padding id's zero), the CNN N(0, 1/(width *
        E)), highways and the projection N(0, 1/F) with the highway gate's bias at -2, the LSTMs Glorot-uniform with
        zero biases, the softmax N(0, 1/P) (its rows drawn whole, then this rank's slice taken: the same under any TP)."""
        chars, width = self.chars, sum(n for _, n in self.cfg.char_filters)
        nn.init.uniform_(chars.embedding.weight, -1, 1)
        for (w, _), conv in zip(self.cfg.char_filters, chars.convs):
            nn.init.normal_(conv.weight, std=math.sqrt(1 / (w * self.cfg.char_embedding_size)))
            nn.init.zeros_(conv.bias)
        for highway in chars.highways:
            for linear, bias in ((highway.transform, 0.0), (highway.carry, -2.0)):
                nn.init.normal_(linear.weight, std=math.sqrt(1 / width))
                nn.init.constant_(linear.bias, bias)
        nn.init.normal_(chars.projection.weight, std=math.sqrt(1 / width))
        nn.init.zeros_(chars.projection.bias)
        with torch.no_grad():
            chars.embedding.weight[0] = 0  # a padding word's characters
        for lstm in (*self.forward_lstms, *self.backward_lstms):
            for linear in (lstm.input, lstm.state, lstm.projection):
                nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(lstm.state.bias)
        whole = torch.empty(self.cfg.padded_vocab, self.cfg.hidden_size)
        nn.init.normal_(whole, std=1 / math.sqrt(self.cfg.hidden_size))
        rows = self.softmax.weight.shape[0]
        with torch.no_grad():
            self.softmax.weight.copy_(whole[self.tp.rank() * rows:(self.tp.rank() + 1) * rows])

    def stacks(self, chars, lengths=None):
        """The word vectors and each stack's layer outputs ([b, s, P] each; the backward ones in reversed order)."""
        e = self.chars(chars)
        fwd, bwd = [e], [flip(e, lengths)]
        for stack, states in ((self.forward_lstms, fwd), (self.backward_lstms, bwd)):
            for i, lstm in enumerate(stack):
                x = self.dropout(states[-1])
                states.append(lstm(x) + x if i else lstm(x))
        return fwd, bwd

    def layers(self, chars, lengths=None):
        """ELMo's representations: the word vectors twice, then each layer's forward and backward states."""
        fwd, bwd = self.stacks(chars, lengths)
        return [torch.cat([f, flip(b, lengths)], -1) for f, b in zip(fwd, bwd)]

    def forward(self, chars, lengths=None):
        fwd, bwd = self.stacks(chars, lengths)
        return {"forward": fwd[-1], "backward": flip(bwd[-1], lengths)}

    def external_parameters(self):
        return iter(())
