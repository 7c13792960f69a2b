"""DistilBERT (Sanh et al. 2019): BERT with half the layers, no token types and no pooler, distilled from a BERT
teacher (pretrain/objectives/distillation.py: soft targets, masked LM and the hidden states' cosine, the student
starting from every other teacher layer). Exports as DistilBertForMaskedLM and imports it."""
from __future__ import annotations

from pretrain.families.base import ACTIVATIONS, Adapter, ExportError, Family
from pretrain.families.bert import COMPUTES

ORDER = 140
FEATURES = dict(norm="post", activation="gelu", causal=False, heads=["mlm"], scaled_init=False,
                position_encoding="learned", share_layers="none")


class DistilBertAdapter(Adapter):
    hf_class = "DistilBertForMaskedLM"
    model_type = "distilbert"
    tokenizer_class = "BertTokenizer"  # (transformers' for DistilBERT)
    prefix = "distilbert."
    layer = "{p}transformer.layer.{i}."
    qkv = "attention"
    qkv_names = ("q_lin", "k_lin", "v_lin")
    layer_keys = {
        "attn.out.weight": "attention.out_lin.weight", "attn.out.bias": "attention.out_lin.bias",
        "attn_norm.weight": "sa_layer_norm.weight", "attn_norm.bias": "sa_layer_norm.bias",
        "mlp.fc1.weight": "ffn.lin1.weight", "mlp.fc1.bias": "ffn.lin1.bias",
        "mlp.fc2.weight": "ffn.lin2.weight", "mlp.fc2.bias": "ffn.lin2.bias",
        "mlp_norm.weight": "output_layer_norm.weight", "mlp_norm.bias": "output_layer_norm.bias",
    }
    keys = {"embeddings.word.weight": "{p}embeddings.word_embeddings.weight",
            "embeddings.position.weight": "{p}embeddings.position_embeddings.weight",
            "embeddings.norm.weight": "{p}embeddings.LayerNorm.weight",
            "embeddings.norm.bias": "{p}embeddings.LayerNorm.bias",
            "mlm.dense.weight": "vocab_transform.weight", "mlm.dense.bias": "vocab_transform.bias",
            "mlm.norm.weight": "vocab_layer_norm.weight", "mlm.norm.bias": "vocab_layer_norm.bias",
            "mlm.bias": "vocab_projector.bias"}
    tied = {"vocab_projector.weight": "distilbert.embeddings.word_embeddings.weight"}
    computes = {**COMPUTES, "heads": ("mlm",), "type_vocab_size": (0,)}

    def problems(self, cfg):
        out = super().problems(cfg)
        if cfg.layer_norm_eps != 1e-12:
            out.append(f"model.layer_norm_eps={cfg.layer_norm_eps} has no HF class: {self.hf_class}'s LayerNorms "
                       f"use 1e-12; keep the model in ptm's format, or train one with that epsilon")
        return out

    def hf_config(self, cfg, special):
        import transformers

        return transformers.DistilBertConfig(
            vocab_size=cfg.vocab_size, max_position_embeddings=cfg.max_position_embeddings, n_layers=cfg.num_layers,
            n_heads=cfg.num_heads, dim=cfg.hidden_size, hidden_dim=cfg.ffn_hidden_size,
            dropout=cfg.hidden_dropout, attention_dropout=cfg.attention_dropout,
            activation=ACTIVATIONS[cfg.activation], initializer_range=cfg.init_std,
            pad_token_id=special.get("pad", 0), architectures=[self.hf_class])

    def model_config(self, hf):
        activation = {v: k for k, v in ACTIVATIONS.items()}.get(hf.activation)
        if activation is None or hf.sinusoidal_pos_embds:
            raise ExportError(f"activation={hf.activation!r}, sinusoidal_pos_embds={hf.sinusoidal_pos_embds}: ptm's "
                              f"DistilBERT has {', '.join(ACTIVATIONS.values())} and learned positions")
        return dict(arch="distilbert", vocab_size=hf.vocab_size, vocab_pad_to=1, hidden_size=hf.dim,
                    num_layers=hf.n_layers, num_heads=hf.n_heads, ffn_hidden_size=hf.hidden_dim, activation=activation,
                    max_position_embeddings=hf.max_position_embeddings, type_vocab_size=0, task_type_vocab_size=0,
                    layer_norm_eps=1e-12, hidden_dropout=hf.dropout, attention_dropout=hf.attention_dropout,
                    init_std=hf.initializer_range)


FAMILY = Family("distilbert", "DistilBERT: BERT without token types or pooler, distilled from a teacher", FEATURES,
                DistilBertAdapter())
