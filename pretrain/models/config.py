"""The model's shape and options (the `model` section of a training config)."""
from __future__ import annotations

from dataclasses import dataclass, field

ARCHS = ("bert", "gpt2", "ernie")


@dataclass
class ModelConfig:
    arch: str = "bert"  # bert | gpt2 | ernie
    vocab_size: int = 0  # 0: the dataset's vocabulary
    vocab_pad_to: int = 128  # embedding rows are padded to a multiple of this (and of parallel.tp)
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    ffn_hidden_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2  # segment embeddings (BERT, ERNIE); 0 for GPT-2
    task_type_vocab_size: int = 0  # ERNIE 2.0 task embeddings (HF use_task_id); 0: none
    layer_norm_eps: float = 1e-12
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    init_std: float = 0.02
    activation_checkpointing: bool | list[int] = field(default=False)  # all layers, or these layer indices


def padded_vocab_size(cfg: ModelConfig) -> int:
    """The vocabulary rounded up to `vocab_pad_to` (GPU-friendly shapes, divisible by any TP size that
    divides it); the extra rows are never predicted (their logits are masked)."""
    return -(-cfg.vocab_size // cfg.vocab_pad_to) * cfg.vocab_pad_to
