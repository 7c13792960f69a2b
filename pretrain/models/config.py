"""The model's shape and options (the `model` section of a training config).

The model reads *features* (LayerNorm position, activation, attention direction, heads, initialisation),
never an architecture name. `arch` names a family (pretrain/families/): a feature the config leaves unset (None)
takes the family's value, so `arch: gpt2` alone is GPT-2, and a config may change any one feature. `arch` also picks
the Hugging Face adapter for conversion, which refuses a model whose features its HF class does not compute.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pretrain import families
from pretrain.schema import opt

FUSED_CHUNK_BYTES = 256 * 2 ** 20  # the fused LM loss's chunk of logits, at most (`kernels.fused_chunk_rows`; `ptm
# plan` counts it without importing the kernels)

NORMS = ("post", "pre")  # post-LN (BERT): embedding LayerNorm; pre-LN (GPT-2): a final LayerNorm
NORM_TYPES = ("layernorm", "rmsnorm")  # LayerNorm with a bias; T5's: scale only, no mean subtracted, no bias
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "tanh")
HEADS = ("lm", "mlm", "rtd", "nsp")  # tied LM projection; BERT's MLM transform + tied projection; ELECTRA's
# replaced-token detection (a per-token 1-way head, with a generator); pooler + 2-way head
SHARING = ("none", "all", "attention", "ffn")  # ALBERT's cross-layer parameter sharing
ATTENTIONS = {"global": (), "local": ("attention_window",)}  # a layer's attention: every position (every earlier one,
# causal) | a band of the nearest attention_window positions (GPT-3's locally banded layers, GPT-Neo's "local"); each
# with the model fields only it reads (`unread`)


@dataclass(frozen=True)
class PositionEncoding:
    """A value of `model.position_encoding` as the shared layers, the cost model and the checks read it: they ask
    these properties (`ModelConfig.positional`), never the name."""

    help: str
    table: bool = False  # a learned table of absolute positions, max_position_embeddings rows
    from_pad: bool = False  # numbered from pad_token_id + 1, padding tokens at pad_token_id (RoBERTa's)
    pair_terms: bool = False  # a term per query-key pair inside attention (NEZHA's): ptm's own attention core, which
    # keeps the scores, and twice the scores' FLOPs
    score_bias: bool = False  # a learned bias per head and distance bucket added to the scores, one per stack (T5's)
    kernel: str = ""  # the attention kernel where it is not torch SDPA ("": SDPA, any bias passed as its mask)
    keys: tuple = ()  # the model fields only it reads (a config giving one under another encoding: `unread`)


POSITIONS = {
    "learned": PositionEncoding("absolute positions from 0", table=True, keys=("position_offset",)),
    "roberta": PositionEncoding("from pad_token_id + 1, padding tokens at pad_token_id, as HF RoBERTa", table=True,
                                from_pad=True, keys=("pad_token_id",)),
    "relative": PositionEncoding("NEZHA's functional relative positions: fixed sinusoids of the clipped distance added "
                                 "to keys and values inside attention, no position table", pair_terms=True,
                                 kernel="ptm's matmuls + softmax (relative positions)",
                                 keys=("max_relative_position",)),
    "bucketed": PositionEncoding("T5's learned bias per head and distance bucket, bidirectional in an encoder, causal "
                                 "in a decoder", score_bias=True, keys=("relative_buckets", "relative_max_distance")),
    "transformer_xl": PositionEncoding("XLNet's: sinusoids of the distance projected per layer, content and position "
                                       "biases u and v; two-stream attention and a memory",
                                       kernel="ptm's matmuls + softmax (Transformer-XL's relative positions)",
                                       keys=("clamp_len",)),
}
ARCH_FEATURES = families.ARCH_FEATURES
ARCHS = families.names()


@dataclass
class SharedModelConfig:
    """The model fields any family may use; `ModelConfig` joins each family's own (its `Family.section`)."""

    arch: str = opt("bert", " | ".join(ARCHS) + ": a family (pretrain/families/): the features below that a config "
                            "leaves unset take its values, and its Hugging Face class converts the model",
                    choices=families.names)
    vocab_size: int = opt(0, "vocabulary size; 0: the dataset's tokenizer", range=">= 0")
    vocab_pad_to: int = opt(128, "embedding rows are padded to a multiple of this (must be divisible by parallel.tp)",
                            range="> 0")
    hidden_size: int = opt(768, "width of the hidden states", range="> 0")
    embedding_size: int = opt(0, "width of the embeddings, projected to hidden_size (ALBERT's factorised embedding); "
                                 "the MLM head maps back to it; 0: hidden_size", range=">= 0")
    num_layers: int = opt(12, "transformer layers (of the encoder, in an encoder-decoder)", range="> 0")
    num_heads: int = opt(12, "attention heads", range="> 0")
    head_dim: int = opt(0, "width of each attention head (Megatron's kv_channels, T5's d_kv); 0: hidden_size / "
                           "num_heads (T5 1.1 small: 6 heads of 64 in a 512-wide model)", range=">= 0")
    ffn_hidden_size: int = opt(3072, "inner width of the MLP", range="> 0")
    max_position_embeddings: int = opt(512, "learned positions: rows of the position table (the longest data.seq_len "
                                            "the model takes, plus any offset)", range="> 0")
    position_offset: int = opt(0, "learned positions: the row of position 0 (BART's tables start at 2)", range=">= 0")
    type_vocab_size: int = opt(2, "segment embeddings (BERT, ERNIE); 0 for GPT-2", range=">= 0")
    task_type_vocab_size: int = opt(0, "ERNIE 2.0 task-type embeddings (HF use_task_id); 0: none", range=">= 0")
    max_relative_position: int = opt(64, "position_encoding=relative: attention tells distances apart up to this many "
                                         "tokens (NEZHA: 64)", range="> 0")
    relative_buckets: int = opt(32, "position_encoding=bucketed: distance buckets of T5's relative position bias "
                                    "(half per direction in the encoder)", range="> 0")
    relative_max_distance: int = opt(128, "position_encoding=bucketed: distances from this on share the last "
                                          "bucket (T5: 128)", range="> 0")
    attention_window: int = opt(256, "attention_layers' local layers: each query attends to the attention_window "
                                     "nearest positions (causal: itself and the attention_window - 1 before it; "
                                     "GPT-Neo's window_size)", range="> 0")
    pad_token_id: int = opt(-1, "the padding id, which position_encoding=roberta numbers positions from; -1: the "
                                "dataset's")
    layer_norm_eps: float = opt(1e-12, "LayerNorm epsilon", range="> 0")
    hidden_dropout: float = opt(0.1, "dropout on embeddings and sublayer outputs", range="[0, 1)")
    attention_dropout: float = opt(0.1, "dropout on attention probabilities", range="[0, 1)")
    init_std: float = opt(0.02, "standard deviation of the normal weight initialisation", range="> 0")
    activation_checkpointing: bool | list[int] = opt(False, "recompute activations in the backward pass: true (every "
                                                            "layer) or layer indices")
    # features: None takes the arch's (its family's FEATURES)
    norm: str | None = opt(None, "post: LayerNorm after each residual sum (BERT, GPT); pre: before each sublayer, and "
                                 "a final one (GPT-2); null: the arch's", choices=NORMS)
    norm_type: str | None = opt(None, "layernorm | rmsnorm (T5's: scale only, no mean subtracted, no bias); null: "
                                      "the arch's", choices=NORM_TYPES)
    bias: bool | None = opt(None, "biases in the attention and MLP linear layers (T5 has none); null: the arch's")
    gated_mlp: bool | None = opt(None, "the MLP's activation gates a second projection: act(x W0) * (x W1) (T5 1.1's "
                                       "gated GELU); null: the arch's")
    scaled_attention: bool | None = opt(None, "scale attention scores by 1/sqrt(head_dim) (T5 folds it into the "
                                              "initialisation instead); null: the arch's")
    init: str | None = opt(None, "normal (every weight N(0, init_std)) | t5 (T5's per-matrix scales: embeddings "
                                 "N(0, 1), queries (d * d_head)^-1/2, ...); null: the arch's", choices=("normal", "t5"))
    scaled_logits: bool | None = opt(None, "multiply the hidden states by hidden_size**-0.5 before the tied output "
                                           "projection (T5 1.0); null: the arch's")
    embedding_norm: bool | None = opt(None, "LayerNorm on the embeddings (BERT; not GPT's post-LN decoder); null: the "
                                            "arch's, else as norm=post")
    activation: str | None = opt(None, " | ".join(ACTIVATIONS) + ": the MLP's activation; null: the arch's",
                                 choices=ACTIVATIONS)
    causal: bool | None = opt(None, "attend to earlier tokens only (GPT-2); null: the arch's")
    heads: list[str] | None = opt(None, "output heads: lm (word embeddings as output projection), mlm (BERT's "
                                        "transform first), rtd (ELECTRA's replaced-token detection, with a generator), "
                                        "nsp (pooler + 2-way classifier for NSP/SOP); null: the arch's")
    scaled_init: bool | None = opt(None, "initialise residual output projections with init_std / sqrt(2 * "
                                         "num_layers) (GPT-2); null: the arch's")
    position_encoding: str | None = opt(None, " | ".join(f"{name} ({p.help})" for name, p in POSITIONS.items())
                                        + "; null: the arch's", choices=tuple(POSITIONS))
    attention_layers: list[str] | None = opt(None, "the attention of each layer, the list repeated over the layers: "
                                                   "global (every position; causal: every earlier one) | local (the "
                                                   "attention_window nearest, GPT-3's locally banded layers); e.g. "
                                                   "[global, local] alternates them; null: the arch's")
    qkv_bias: bool | None = opt(None, "biases on the attention's query, key and value projections (with model.bias; "
                                      "GPT-Neo has none); null: the arch's")
    share_layers: str | None = opt(None, "none | all (one layer's parameters for every layer, ALBERT) | attention | "
                                         "ffn (only those sublayers shared); null: the arch's", choices=SHARING)

    def __post_init__(self):
        # an unknown arch: a ConfigError in validation
        for key, value in {**families.COMMON, **ARCH_FEATURES.get(self.arch, {})}.items():
            if getattr(self, key) is None:
                setattr(self, key, list(value) if isinstance(value, list) else value)

    @property
    def padded_vocab(self) -> int:
        """The vocabulary rounded up to `vocab_pad_to` (GPU-friendly shapes, divisible by any TP size that divides it);
        the extra rows are never predicted (their logits are masked)."""
        return -(-self.vocab_size // self.vocab_pad_to) * self.vocab_pad_to

    @property
    def positional(self) -> PositionEncoding:
        """What `position_encoding` computes."""
        return POSITIONS[self.position_encoding]

    def attention(self, layer: int) -> str:
        """The attention of layer `layer` (global | local): `attention_layers`, repeated."""
        return self.attention_layers[layer % len(self.attention_layers)]

    @property
    def head_size(self) -> int:
        """The width of one attention head: `head_dim`, or the hidden size split over the heads."""
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def attention_width(self) -> int:
        """The width of the queries, keys, values and the attention output: every head's."""
        return self.num_heads * self.head_size


def _sections() -> list[tuple]:
    """Every family's own model fields (`Family.section`: ELMo's character CNN, XLNet's memory, ELECTRA's generator,
    the encoder-decoders' decoder), once each, in the registry's order."""
    joined = {}
    for family in families.REGISTRY.values():
        for name, type_, spec in family.section:
            joined.setdefault(name, (name, type_, spec))
    return list(joined.values())


ModelConfig = dataclasses.make_dataclass("ModelConfig", _sections(), bases=(SharedModelConfig,))
ModelConfig.__module__ = __name__
ModelConfig.__doc__ = "The `model` section: the shared fields and every family's own (`Family.section`)."

FEATURES = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.default is None)  # what the model computes


def unread(cfg: ModelConfig) -> set[str]:
    """The model fields that some position encodings or attention kinds read (`PositionEncoding.keys`, `ATTENTIONS`)
    and `cfg`'s do not: their values change nothing in this model."""
    some = {k for p in POSITIONS.values() for k in p.keys} | {k for keys in ATTENTIONS.values() for k in keys}
    return some - {*cfg.positional.keys, *(k for a in set(cfg.attention_layers) for k in ATTENTIONS[a])}


def normalises_embeddings(cfg: ModelConfig) -> bool:
    """Whether the embeddings get a LayerNorm: `embedding_norm`, or where it is unset, post-LN models' (BERT's)."""
    return cfg.norm == "post" if cfg.embedding_norm is None else cfg.embedding_norm


def embedding_width(cfg: ModelConfig) -> int:
    return cfg.embedding_size or cfg.hidden_size


def positions_needed(cfg: ModelConfig, seq_len: int) -> int:
    """Rows of the position table that sequences of `seq_len` use (RoBERTa's start past the padding id)."""
    return seq_len + (cfg.pad_token_id + 1 if cfg.positional.from_pad else cfg.position_offset)

