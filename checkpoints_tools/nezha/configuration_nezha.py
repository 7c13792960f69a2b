"""NEZHA's configuration (Wei et al. 2019, "NEZHA: Neural Contextualized Representation for Chinese Language
Understanding"): BERT's, with functional relative positions clipped at `max_relative_position`. Written by ptm."""
from transformers import PreTrainedConfig


class NezhaConfig(PreTrainedConfig):
    model_type = "nezha"

    vocab_size: int = 21128
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512  # the longest input; there is no position table
    max_relative_position: int = 64
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    tie_word_embeddings: bool = True
