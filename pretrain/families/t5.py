"""T5 (Raffel et al. 2020): a pre-LN encoder-decoder with RMSNorm and no biases, T5's bucketed relative position bias
(one table per stack), unscaled attention scores, a ReLU MLP (T5 1.0; 1.1: gated GELU, the `t5-v1_1-*` presets) and
the word embeddings shared by both stacks and the LM head, whose input 1.0 scales by hidden_size**-0.5. Exports as
T5ForConditionalGeneration (transformers 5 always ties its LM head; `tie_word_embeddings: false` in the config turns
the scaling off, which is how it reads a 1.1 model)."""
from __future__ import annotations

from pretrain.families.base import ExportError, Family, hf_special_tokens, with_offsets_kept
from pretrain.families.encoder_decoder import MODEL, SECTION, EncoderDecoderAdapter, EncoderDecoderCost

ORDER = 110
FEATURES = dict(norm="pre", norm_type="rmsnorm", bias=False, gated_mlp=False, activation="relu", causal=False,
                heads=["lm"], scaled_init=False, position_encoding="bucketed", share_layers="none",
                scaled_attention=False, scaled_logits=True, embedding_norm=False, init="t5")
COMPUTES = dict(norm=("pre",), norm_type=("rmsnorm",), bias=(False,), gated_mlp=(False, True),
                activation=("relu", "gelu_tanh"), causal=(False,), heads=("lm",), position_encoding=("bucketed",),
                share_layers=("none",), scaled_attention=(False,), scaled_logits=(False, True),
                embedding_norm=(None, False), embedding_size=(0,), type_vocab_size=(0,), task_type_vocab_size=(0,))


MLP = {"mlp_norm.weight": "layer.{ff}.layer_norm.weight", "mlp.fc2.weight": "layer.{ff}.DenseReluDense.wo.weight"}
GATED = {"mlp.fc1.weight": "layer.{ff}.DenseReluDense.wi_0.weight",
         "mlp.gate.weight": "layer.{ff}.DenseReluDense.wi_1.weight"}
PLAIN = {"mlp.fc1.weight": "layer.{ff}.DenseReluDense.wi.weight"}
CROSS = {"cross_norm.weight": "layer.1.layer_norm.weight", "cross.q.weight": "layer.1.EncDecAttention.q.weight",
         "cross.out.weight": "layer.1.EncDecAttention.o.weight"}


class T5Adapter(EncoderDecoderAdapter):
    hf_class = "T5ForConditionalGeneration"
    model_type = "t5"
    computes = COMPUTES
    tokenizer = "none"  # (its own: `own_tokenizer`)
    tokenizer_class = "T5Tokenizer"
    head_widths = True
    self_attention = "layer.0.SelfAttention.{}"
    cross_attention = "layer.1.EncDecAttention.{}"
    gated_key = ".DenseReluDense.wi_1."
    keys = {"embeddings.word.weight": "shared.weight", "encoder.final_norm.weight": "encoder.final_layer_norm.weight",
            "decoder.final_norm.weight": "decoder.final_layer_norm.weight",
            "encoder.bias.weight": "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            "decoder.bias.weight": "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"}
    tied = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")

    def layer_keys(self, stack, gated):
        """The decoder's sublayers number one more after self-attention: its MLP is layer 2."""
        keys = {"attn_norm.weight": "layer.0.layer_norm.weight", "attn.out.weight": "layer.0.SelfAttention.o.weight",
                **MLP, **(GATED if gated else PLAIN), **(CROSS if stack == "decoder" else {})}
        return {k: v.format(ff=2 if stack == "decoder" else 1) for k, v in keys.items()}

    def own_tokenizer(self, tok, meta: dict):
        """T5's: each sequence followed by the end-of-sequence token, and the sentinels after the vocabulary
        (`<extra_id_0>` the last id, as data_prep numbers them)."""
        import transformers
        from tokenizers import processors

        sentinels = [f"<extra_id_{k}>" for k in range(meta.get("sentinels", 0))]
        tok.add_special_tokens(sentinels[::-1])  # appended in order: <extra_id_0> last
        special = hf_special_tokens(meta["special_ids"], tok.id_to_token, "unk", "pad", null=True, eos="eod")
        eos = special["eos_token"]
        tok.post_processor = with_offsets_kept(tok, processors.TemplateProcessing(
            single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, meta["special_ids"]["eod"])]))
        return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **special,
                                                    additional_special_tokens=sentinels,
                                                    model_input_names=["input_ids", "attention_mask"])

    def hf_config(self, cfg, special):
        import transformers

        if cfg.decoder_layers == 0:
            raise ExportError("model.decoder_layers=0: T5ForConditionalGeneration needs a decoder; set "
                              "model.decoder_layers")
        return transformers.T5Config(
            vocab_size=cfg.vocab_size, d_model=cfg.hidden_size, d_kv=cfg.head_size,
            d_ff=cfg.ffn_hidden_size, num_layers=cfg.num_layers, num_decoder_layers=cfg.decoder_layers,
            num_heads=cfg.num_heads, relative_attention_num_buckets=cfg.relative_buckets,
            relative_attention_max_distance=cfg.relative_max_distance, dropout_rate=cfg.hidden_dropout,
            layer_norm_epsilon=cfg.layer_norm_eps, feed_forward_proj="gated-gelu" if cfg.gated_mlp else "relu",
            tie_word_embeddings=cfg.scaled_logits, pad_token_id=special.get("pad", 0),
            eos_token_id=special.get("eod", 1), decoder_start_token_id=special.get("pad", 0),
            architectures=[self.hf_class])

    def model_config(self, hf):
        gated = hf.is_gated_act
        if hf.dense_act_fn not in (("gelu_new",) if gated else ("relu",)):
            raise ExportError(f"feed_forward_proj={hf.feed_forward_proj!r}: ptm's T5 has relu or gated-gelu")
        return dict(arch="t5", vocab_size=hf.vocab_size, vocab_pad_to=1, hidden_size=hf.d_model,
                    num_layers=hf.num_layers, decoder_layers=hf.num_decoder_layers, num_heads=hf.num_heads,
                    head_dim=0 if hf.d_kv * hf.num_heads == hf.d_model else hf.d_kv, ffn_hidden_size=hf.d_ff, relative_buckets=hf.relative_attention_num_buckets,
                    relative_max_distance=hf.relative_attention_max_distance, type_vocab_size=0,
                    task_type_vocab_size=0, layer_norm_eps=hf.layer_norm_epsilon, hidden_dropout=hf.dropout_rate,
                    attention_dropout=hf.dropout_rate, gated_mlp=gated, activation="gelu_tanh" if gated else "relu",
                    scaled_logits=hf.scale_decoder_outputs)


def check(cfg, need, objective) -> None:
    """T5's bucketed relative bias is an encoder-decoder's (pretrain/models/seq2seq.py)."""
    need(cfg.model.position_encoding != "bucketed" or cfg.model.decoder_layers > 0,
         "model.position_encoding=bucketed is T5's relative bias of an encoder-decoder; set model.decoder_layers or "
         "another model.position_encoding")


FAMILY = Family("t5", "T5: pre-LN encoder-decoder, RMSNorm, bucketed relative bias, span corruption",
                FEATURES, T5Adapter(), check, model=MODEL,
                cost=EncoderDecoderCost(), section=SECTION)
