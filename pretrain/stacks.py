"""A stack of transformer layers and what one of its layers costs: torch-free formulas that pretrain/cost.py and the
families' cost hooks (pretrain/families/, `Cost`) share. Nothing of ptm is imported here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Stack:
    """One stack of transformer layers: its sizes (`model`, a ModelConfig), depth, the tokens per sequence it runs on,
    and for a decoder of an encoder-decoder the keys per sequence its cross-attention reads (0: none). A family's
    cost hook may give it a second stream of queries on `queries` tokens (XLNet's), `memory` keys more for every query
    (Transformer-XL's memory of earlier segments), attention that keeps its probabilities for the backward pass
    (`keeps_scores`: scores in plain matmuls), and its own formula for one layer's FLOPs (`layer(stack)`)."""

    model: object
    layers: int
    seq_len: int
    context: int = 0
    queries: int = 0
    memory: int = 0
    keeps_scores: bool = False
    layer: Callable | None = None

    @property
    def recomputed(self) -> int:
        """How many of its layers `model.activation_checkpointing` recomputes (each stack numbers its own)."""
        setting = self.model.activation_checkpointing
        return self.layers if setting is True else len({i for i in setting or () if i < self.layers})


def attended_keys(m, seq_len: int, layer: int = 0) -> int:
    """The keys each query's scores are counted over in layer `layer` (`model.attention_layers`): a global layer's,
    every position of the sequence (causal masking's halving is not applied, as in Megatron and nanoGPT); a local
    layer's, its band: attention_window positions when causal, 2 * attention_window - 1 when not, at most the
    sequence (the band's first rows, shorter at the sequence's start, are not discounted either)."""
    if m.attention(layer) == "global":
        return seq_len
    return min(seq_len, m.attention_window if m.causal else 2 * m.attention_window - 1)


def layer_flops_per_sample(m, seq_len: int, layer: int = 0) -> int:
    """Training FLOPs of layer `layer` on one sequence: its matmuls 6*s*(4ha + 2hf) and attention 12*a*s*k (doubled
    with relative positions), a the attention width (= h unless model.head_dim sets it), k the keys each query reads
    (`attended_keys`: s, or a local layer's band); see pretrain/cost.py's model_flops_per_sample."""
    h, s, a = m.hidden_size, seq_len, m.attention_width
    return 6 * s * (4 * h * a + (3 if m.gated_mlp else 2) * h * m.ffn_hidden_size) + 12 * a * s * attended_keys(
        m, s, layer) * (2 if m.positional.pair_terms else 1)


def cross_flops_per_sample(m, seq_len: int, context: int) -> int:
    """Training FLOPs of one decoder layer's cross-attention: queries and output on `seq_len` tokens (6*s*2ha), keys
    and values of the `context` encoder outputs (6*c*2ha), scores and weighted sum over s x c (12*a*s*c)."""
    h, a = m.hidden_size, m.attention_width
    return 12 * seq_len * h * a + 12 * context * h * a + 12 * a * seq_len * context


def stack_flops(stack: Stack) -> int:
    """Training FLOPs of one sequence through a stack's layers, a decoder's cross-attention included."""
    if stack.layer:
        return stack.layers * stack.layer(stack)
    cross = cross_flops_per_sample(stack.model, stack.seq_len, stack.context) if stack.context else 0
    return sum(layer_flops_per_sample(stack.model, stack.seq_len, i) + cross for i in range(stack.layers))


def masked_flops(stack: Stack) -> int:
    """Training FLOPs of one sequence that a stack's attention kernels compute and its masks then discard: each local
    layer's scores and weighted sum outside its band (SDPA under a band mask computes the whole s x s square). Not
    model FLOPs (`stack_flops` leaves them out); the speed model adds them to the time."""
    if stack.layer:
        return 0
    m, s = stack.model, stack.seq_len
    return sum(12 * m.attention_width * s * (s - attended_keys(m, s, i)) for i in range(stack.layers))
