"""BART (Lewis et al. 2020): a post-LN encoder-decoder with biases, GELU, learned positions in a table per stack that
starts at row 2, a LayerNorm on each stack's embeddings and the word embeddings shared by both stacks and the LM
head. Exports as BartForConditionalGeneration (its `final_logits_bias` zero, as BART trains it); MASS trains the same
model with its own objective."""
from __future__ import annotations

from pretrain.families.base import ExportError, Family
from pretrain.families.encoder_decoder import MODEL, SECTION, EncoderDecoderAdapter, EncoderDecoderCost

ORDER = 120
FEATURES = dict(norm="post", norm_type="layernorm", bias=True, gated_mlp=False, activation="gelu", causal=False,
                heads=["lm"], scaled_init=False, position_encoding="learned", share_layers="none",
                scaled_attention=True, scaled_logits=False, embedding_norm=True)
COMPUTES = dict(norm=("post",), norm_type=("layernorm",), bias=(True,), gated_mlp=(False,), activation=("gelu",),
                causal=(False,), heads=("lm",), position_encoding=("learned",), share_layers=("none",),
                scaled_attention=(True,), scaled_logits=(False,), embedding_norm=(None, True), embedding_size=(0,),
                type_vocab_size=(0,), task_type_vocab_size=(0,))
OFFSET = 2  # BART's position tables start at row 2
LAYER = {"attn_norm": "self_attn_layer_norm", "attn.out": "self_attn.out_proj", "mlp.fc1": "fc1", "mlp.fc2": "fc2",
         "mlp_norm": "final_layer_norm"}
CROSS = {"cross_norm": "encoder_attn_layer_norm", "cross.q": "encoder_attn.q_proj",
         "cross.out": "encoder_attn.out_proj"}
EMBEDDINGS = {"embeddings": "model.encoder", "decoder_embeddings": "model.decoder"}


class BartAdapter(EncoderDecoderAdapter):
    hf_class = "BartForConditionalGeneration"
    model_type = "bart"
    computes = COMPUTES
    tokenizer = "roberta"  # <s> A </s></s> B </s>, as BART's
    tokenizer_class = "RobertaTokenizer"  # (transformers' for BART)
    block = "model.{stack}.layers.{i}."
    self_attention = "self_attn.{}_proj"
    cross_attention = "encoder_attn.{}_proj"
    kinds = ("weight", "bias")
    keys = {"embeddings.word.weight": "model.shared.weight",
            **{f"{ours}.{k}": f"{theirs}.{v}" for ours, theirs in EMBEDDINGS.items() for k, v in (
                ("position.weight", "embed_positions.weight"), ("norm.weight", "layernorm_embedding.weight"),
                ("norm.bias", "layernorm_embedding.bias"))}}
    tied = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")

    def layer_keys(self, stack, gated):
        names = {**LAYER, **(CROSS if stack == "decoder" else {})}
        return {f"{ours}.{kind}": f"{theirs}.{kind}" for ours, theirs in names.items() for kind in ("weight", "bias")}

    def from_hf(self, hf, num_layers, num_heads, vocab_rows, task_types=False):
        bias = hf.get("final_logits_bias")
        if bias is not None and bias.any():
            raise ExportError("final_logits_bias is not zero: ptm's BART has no bias on its logits; fine-tuned "
                              "checkpoints that learned one do not import")
        return super().from_hf(hf, num_layers, num_heads, vocab_rows, task_types)

    def to_hf(self, ours, num_layers, num_heads, vocab_size):
        import torch

        out = super().to_hf(ours, num_layers, num_heads, vocab_size)
        out["final_logits_bias"] = torch.zeros(1, vocab_size)
        return out

    def hf_config(self, cfg, special):
        import transformers

        if cfg.position_offset != OFFSET:
            raise ExportError(f"model.position_offset={cfg.position_offset}: BART's position tables start at row "
                              f"{OFFSET}; set model.position_offset={OFFSET}")
        eos = special.get("eod")
        return transformers.BartConfig(
            vocab_size=cfg.vocab_size, d_model=cfg.hidden_size, encoder_layers=cfg.num_layers,
            decoder_layers=cfg.decoder_layers, encoder_attention_heads=cfg.num_heads,
            decoder_attention_heads=cfg.num_heads, encoder_ffn_dim=cfg.ffn_hidden_size,
            decoder_ffn_dim=cfg.ffn_hidden_size, max_position_embeddings=cfg.max_position_embeddings - OFFSET,
            dropout=cfg.hidden_dropout, attention_dropout=cfg.attention_dropout, activation_dropout=0.0,
            activation_function="gelu", init_std=cfg.init_std, scale_embedding=False,
            pad_token_id=special.get("pad"), bos_token_id=special.get("cls"), eos_token_id=eos,
            decoder_start_token_id=eos, forced_eos_token_id=eos, architectures=[self.hf_class])

    def model_config(self, hf):
        problems = [f"{k}={getattr(hf, k)}" for k, ok in (("scale_embedding", False), ("activation_function", "gelu"))
                    if getattr(hf, k) != ok]
        if hf.encoder_attention_heads != hf.decoder_attention_heads or hf.encoder_ffn_dim != hf.decoder_ffn_dim:
            problems.append("encoder and decoder widths or heads differ")
        if problems:
            raise ExportError(f"{', '.join(problems)}: ptm's BART has unscaled embeddings, GELU and one shape for "
                              f"both stacks")
        return dict(arch="bart", vocab_size=hf.vocab_size, vocab_pad_to=1, hidden_size=hf.d_model,
                    num_layers=hf.encoder_layers, decoder_layers=hf.decoder_layers,
                    num_heads=hf.encoder_attention_heads, ffn_hidden_size=hf.encoder_ffn_dim,
                    max_position_embeddings=hf.max_position_embeddings + OFFSET, position_offset=OFFSET,
                    type_vocab_size=0, task_type_vocab_size=0, layer_norm_eps=1e-5, hidden_dropout=hf.dropout,
                    attention_dropout=hf.attention_dropout, init_std=hf.init_std)


FAMILY = Family("bart", "BART: post-LN encoder-decoder with biases, learned positions from row 2, denoising",
                FEATURES, BartAdapter(), model=MODEL,
                cost=EncoderDecoderCost(), section=SECTION)
