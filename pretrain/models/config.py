"""The model's shape and options (the `model` section of a training config).

The model reads *features* (LayerNorm position, activation, attention direction, heads, initialisation),
never an architecture name. `arch` names a preset combination of them: a feature the config leaves unset
(None) takes the arch's value, so `arch: gpt2` alone is GPT-2, and a config may change any one feature.
`arch` also picks the Hugging Face class and key map for conversion.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

NORMS = ("post", "pre")  # post-LN (BERT): embedding LayerNorm; pre-LN (GPT-2): a final LayerNorm
ACTIVATIONS = ("gelu", "gelu_tanh")
HEADS = ("lm", "mlm", "rtd", "nsp")  # tied LM projection; BERT's MLM transform + tied projection; ELECTRA's
# replaced-token detection (a per-token 1-way head, with a generator); pooler + 2-way head
POSITIONS = ("learned", "roberta", "relative")  # absolute; RoBERTa's: from pad_token_id + 1, padding at pad_token_id;
# NEZHA's functional relative positions: sinusoids of the clipped distance inside attention, no position table
SHARING = ("none", "all", "attention", "ffn")  # ALBERT's cross-layer parameter sharing
_BERT = dict(norm="post", activation="gelu", causal=False, heads=["mlm", "nsp"], scaled_init=False,
             position_encoding="learned", share_layers="none")
ARCH_FEATURES = {
    "bert": _BERT,
    "gpt2": dict(_BERT, norm="pre", activation="gelu_tanh", causal=True, heads=["lm"], scaled_init=True),
    "ernie": _BERT,
    "roberta": dict(_BERT, heads=["mlm"], position_encoding="roberta"),
    "albert": dict(_BERT, activation="gelu_tanh", share_layers="all"),
    "electra": dict(_BERT, heads=["rtd"]),
    "nezha": dict(_BERT, position_encoding="relative"),
}
ARCHS = tuple(ARCH_FEATURES)
FEATURES = tuple(ARCH_FEATURES["bert"])


@dataclass
class ModelConfig:
    arch: str = "bert"  # one of ARCHS
    vocab_size: int = 0  # 0: the dataset's vocabulary
    vocab_pad_to: int = 128  # embedding rows are padded to a multiple of this (and of parallel.tp)
    hidden_size: int = 768
    embedding_size: int = 0  # width of the embeddings, projected to hidden_size when smaller (ALBERT); 0: hidden_size
    num_layers: int = 12
    num_heads: int = 12
    ffn_hidden_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2  # segment embeddings (BERT, ERNIE); 0 for GPT-2
    task_type_vocab_size: int = 0  # ERNIE 2.0 task embeddings (HF use_task_id); 0: none
    max_relative_position: int = 64  # position_encoding=relative: distances are clipped to +-this (NEZHA: 64)
    generator_size: float = 0.0  # ELECTRA (heads [rtd]): the generator's hidden size, heads and MLP width as a fraction
    pad_token_id: int = -1  # the padding id (position_encoding=roberta numbers positions from it); -1: the dataset's
    layer_norm_eps: float = 1e-12
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    init_std: float = 0.02
    activation_checkpointing: bool | list[int] = field(default=False)  # all layers, or these layer indices
    # features: None takes the arch's (ARCH_FEATURES)
    norm: str | None = None
    activation: str | None = None
    causal: bool | None = None
    heads: list[str] | None = None
    scaled_init: bool | None = None
    position_encoding: str | None = None
    share_layers: str | None = None

    def __post_init__(self):
        for key, value in ARCH_FEATURES.get(self.arch, {}).items():  # an unknown arch: ConfigError in validation
            if getattr(self, key) is None:
                setattr(self, key, list(value) if isinstance(value, list) else value)


def embedding_width(cfg: ModelConfig) -> int:
    return cfg.embedding_size or cfg.hidden_size


def generator_config(cfg: ModelConfig) -> ModelConfig:
    """ELECTRA's generator: a masked LM `generator_size` times as wide as the model (hidden size, heads, MLP), as deep,
    reading the model's embeddings (their width, projected to its own)."""
    f = cfg.generator_size
    return replace(cfg, hidden_size=round(cfg.hidden_size * f), num_heads=max(1, round(cfg.num_heads * f)),
                   ffn_hidden_size=round(cfg.ffn_hidden_size * f), embedding_size=embedding_width(cfg), heads=["mlm"],
                   generator_size=0.0)


def positions_needed(cfg: ModelConfig, seq_len: int) -> int:
    """Rows of the position table that sequences of `seq_len` use (RoBERTa's start past the padding id)."""
    return seq_len + (cfg.pad_token_id + 1 if cfg.position_encoding == "roberta" else 0)


def padded_vocab_size(cfg: ModelConfig) -> int:
    """The vocabulary rounded up to `vocab_pad_to` (GPU-friendly shapes, divisible by any TP size that
    divides it); the extra rows are never predicted (their logits are masked)."""
    return -(-cfg.vocab_size // cfg.vocab_pad_to) * cfg.vocab_pad_to
