"""GPT-3 (Brown et al. 2020, "Language Models are Few-Shot Learners"): GPT-2's model (pre-LN with a final LayerNorm,
learned positions, tanh GELU, residual projections initialised smaller) at sequence length 2048, its layers alternating
dense and locally banded sparse attention ("similar to the Sparse Transformer"); causal LM.

The paper gives neither the band's width nor the attention's biases. Here the band is 256 positions and the query, key
and value projections have no biases, as in GPT-Neo (EleutherAI's replication): so the alternating model is what
GPTNeoForCausalLM computes and exports as one (its attention_types and window_size; GPT-Neo's scores are not scaled,
so the export folds 1/sqrt(head_dim) into the query weights). A dense GPT-3 (`model.attention_layers=[global]`) exports
as GPT2LMHeadModel, its c_attn biases zeros.
"""
from __future__ import annotations

from pretrain.families.base import Adapter, ExportError, Family
from pretrain.families.gpt2 import FEATURES as GPT2_FEATURES
from pretrain.families.gpt2 import GPT2Adapter

ORDER = 25
FEATURES = dict(GPT2_FEATURES, attention_layers=["global", "local"], qkv_bias=False)


def period(layers: list[str]) -> list[str]:
    """The shortest list that repeated gives `layers` (GPT-Neo's per-layer attention_layers -> ptm's)."""
    n = len(layers)
    return next(layers[:p] for p in range(1, n + 1) if n % p == 0 and layers[:p] * (n // p) == layers)


def attention_types(cfg) -> list:
    """GPT-Neo's attention_types of ptm's attention_layers: [[the list, its repeats]], or one entry per layer where
    the list does not divide the layers."""
    layers, n = cfg.attention_layers, cfg.num_layers
    return [[layers, n // len(layers)]] if n % len(layers) == 0 else [[[cfg.attention(i)], 1] for i in range(n)]


class GPTNeoAdapter(Adapter):
    """GPTNeoForCausalLM: separate bias-free q, k, v projections, unscaled scores (`q_scale` folds ptm's
    1/sqrt(head_dim) into the query weights on export), local layers of window_size."""

    hf_class = "GPTNeoForCausalLM"
    causal = True
    model_type = "gpt_neo"
    prefix, layer, keys, tied = GPT2Adapter.prefix, GPT2Adapter.layer, GPT2Adapter.keys, GPT2Adapter.tied  # GPT-2's
    qkv = "attn.attention"
    qkv_names = ("q_proj", "k_proj", "v_proj")
    layer_keys = {**GPT2Adapter.layer_keys, "attn.out.weight": "attn.attention.out_proj.weight",  # GPT-2's, but the
                  "attn.out.bias": "attn.attention.out_proj.bias"}  # attention's output (Linear, not Conv1D)
    computes = dict(GPT2Adapter.computes, qkv_bias=(False,), attention_layers=("global", "local"),
                    scaled_attention=(True, False))
    tokenizer = "none"
    tokenizer_class, stand_ins = GPT2Adapter.tokenizer_class, GPT2Adapter.stand_ins  # (GPT-Neo's tokenizer: GPT-2's)

    def __init__(self, q_scale: float = 1.0):
        self.q_scale = q_scale

    def for_model(self, cfg):
        if "local" not in cfg.attention_layers:
            return DenseAdapter()
        return GPTNeoAdapter(cfg.head_size ** -0.5 if cfg.scaled_attention else 1.0)

    def hf_config(self, cfg, special):
        import transformers

        eod = special.get("eod")
        return transformers.GPTNeoConfig(
            vocab_size=cfg.vocab_size, max_position_embeddings=cfg.max_position_embeddings,
            hidden_size=cfg.hidden_size, num_layers=cfg.num_layers, num_heads=cfg.num_heads,
            attention_types=attention_types(cfg),
            intermediate_size=cfg.ffn_hidden_size, window_size=cfg.attention_window, activation_function="gelu_new",
            resid_dropout=cfg.hidden_dropout, embed_dropout=cfg.hidden_dropout, attention_dropout=cfg.attention_dropout,
            layer_norm_epsilon=cfg.layer_norm_eps, initializer_range=cfg.init_std, bos_token_id=eod, eos_token_id=eod,
            architectures=[self.hf_class])

    def model_config(self, hf):
        if hf.activation_function != "gelu_new":
            raise ExportError(f"activation_function={hf.activation_function!r}: ptm's GPT-3 computes GPT-Neo's tanh "
                              "GELU (gelu_new) only")
        return dict(arch="gpt3", vocab_size=hf.vocab_size, vocab_pad_to=1, hidden_size=hf.hidden_size,
                    num_layers=hf.num_layers, num_heads=hf.num_heads,
                    ffn_hidden_size=hf.intermediate_size or 4 * hf.hidden_size,
                    max_position_embeddings=hf.max_position_embeddings, type_vocab_size=0, task_type_vocab_size=0,
                    attention_layers=period(list(hf.attention_layers)), attention_window=hf.window_size,
                    scaled_attention=False,  # GPT-Neo's scores are q . k, unscaled: imported as they are
                    layer_norm_eps=hf.layer_norm_epsilon, hidden_dropout=hf.resid_dropout,
                    attention_dropout=hf.attention_dropout, init_std=hf.initializer_range)

    def to_hf(self, ours, num_layers, num_heads, vocab_size):
        out = super().to_hf(ours, num_layers, num_heads, vocab_size)
        if self.q_scale != 1.0:
            for i in range(num_layers):
                key = f"{self.layer.format(p=self.prefix, i=i)}{self.qkv}.q_proj.weight"
                out[key] = out[key] * self.q_scale
        return out


class DenseAdapter(GPT2Adapter):
    """A GPT-3 whose layers are all dense: GPT2LMHeadModel, its c_attn biases zeros where the model has none."""

    computes = dict(GPT2Adapter.computes, qkv_bias=(True, False), attention_layers=("global",))

    def to_hf(self, ours, num_layers, num_heads, vocab_size):
        import torch

        out = super().to_hf(ours, num_layers, num_heads, vocab_size)
        for i in range(num_layers):
            at = f"{self.layer.format(p=self.prefix, i=i)}{self.qkv}"
            if f"{at}.bias" not in out:
                out[f"{at}.bias"] = torch.zeros(out[f"{at}.weight"].shape[1], dtype=out[f"{at}.weight"].dtype)
        return out


FAMILY = Family("gpt3", "GPT-3: GPT-2's decoder at seq 2048, alternating dense and locally banded attention",
                FEATURES, GPTNeoAdapter())
