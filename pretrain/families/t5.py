"""T5 (Raffel et al. 2020): a pre-LN encoder-decoder with RMSNorm and no biases, T5's bucketed relative position bias
(one table per stack), unscaled attention scores, a ReLU MLP (T5 1.0; 1.1: gated GELU, the `t5-v1_1-*` presets) and
the word embeddings shared by both stacks and the LM head, whose input 1.0 scales by hidden_size**-0.5. Exports as
T5ForConditionalGeneration (transformers 5 always ties its LM head; `tie_word_embeddings: false` in the config turns
the scaling off, which is how it reads a 1.1 model)."""
from __future__ import annotations

import re

from pretrain.families.base import VOCAB_ROWS, Adapter, ExportError, Family, interleave_qkv, split_qkv

ORDER = 110
FEATURES = dict(norm="pre", norm_type="rmsnorm", bias=False, gated_mlp=False, activation="relu", causal=False,
                heads=["lm"], scaled_init=False, position_encoding="bucketed", share_layers="none",
                scaled_attention=False, scaled_logits=True, embedding_norm=False)
COMPUTES = dict(norm=("pre",), norm_type=("rmsnorm",), bias=(False,), gated_mlp=(False, True),
                activation=("relu", "gelu_tanh"), causal=(False,), heads=("lm",), position_encoding=("bucketed",),
                share_layers=("none",), scaled_attention=(False,), scaled_logits=(False, True),
                embedding_norm=(None, False), embedding_size=(0,), type_vocab_size=(0,), task_type_vocab_size=(0,))


def _layer_keys(gated: bool) -> dict[str, str]:
    """ptm block parameter -> T5's name in block i of a stack; the decoder's sublayer numbers shift by one after
    self-attention ({ff}: the MLP's sublayer)."""
    mlp = ({"mlp.fc1.weight": "layer.{ff}.DenseReluDense.wi_0.weight",
            "mlp.gate.weight": "layer.{ff}.DenseReluDense.wi_1.weight"} if gated
           else {"mlp.fc1.weight": "layer.{ff}.DenseReluDense.wi.weight"})
    return {"attn_norm.weight": "layer.0.layer_norm.weight", "attn.out.weight": "layer.0.SelfAttention.o.weight",
            "mlp_norm.weight": "layer.{ff}.layer_norm.weight", "mlp.fc2.weight": "layer.{ff}.DenseReluDense.wo.weight",
            **mlp}


CROSS = {"cross_norm.weight": "layer.1.layer_norm.weight", "cross.q.weight": "layer.1.EncDecAttention.q.weight",
         "cross.out.weight": "layer.1.EncDecAttention.o.weight"}
TOP = {"embeddings.word.weight": "shared.weight", "encoder.final_norm.weight": "encoder.final_layer_norm.weight",
       "decoder.final_norm.weight": "decoder.final_layer_norm.weight",
       "encoder.bias.weight": "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
       "decoder.bias.weight": "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"}
TIED = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")


class T5Adapter(Adapter):
    hf_class = "T5ForConditionalGeneration"
    model_type = "t5"
    computes = COMPUTES
    tokenizer = "t5"

    def hf_config(self, cfg, special):
        import transformers

        if cfg.decoder_layers == 0:
            raise ExportError("model.decoder_layers=0: T5ForConditionalGeneration needs a decoder; set "
                              "model.decoder_layers")
        return transformers.T5Config(
            vocab_size=cfg.vocab_size, d_model=cfg.hidden_size, d_kv=cfg.hidden_size // cfg.num_heads,
            d_ff=cfg.ffn_hidden_size, num_layers=cfg.num_layers, num_decoder_layers=cfg.decoder_layers,
            num_heads=cfg.num_heads, relative_attention_num_buckets=cfg.relative_buckets,
            relative_attention_max_distance=cfg.relative_max_distance, dropout_rate=cfg.hidden_dropout,
            layer_norm_epsilon=cfg.layer_norm_eps, feed_forward_proj="gated-gelu" if cfg.gated_mlp else "relu",
            tie_word_embeddings=cfg.scaled_logits, pad_token_id=special.get("pad", 0),
            eos_token_id=special.get("eod", 1), decoder_start_token_id=special.get("pad", 0),
            architectures=[self.hf_class])

    def model_config(self, hf):
        if hf.d_kv * hf.num_heads != hf.d_model:
            raise ExportError(f"d_kv * num_heads = {hf.d_kv * hf.num_heads} differs from d_model = {hf.d_model}: "
                              f"ptm's attention splits the hidden size over the heads")
        gated = hf.is_gated_act
        if hf.dense_act_fn not in (("gelu_new",) if gated else ("relu",)):
            raise ExportError(f"feed_forward_proj={hf.feed_forward_proj!r}: ptm's T5 has relu or gated-gelu")
        return dict(arch="t5", vocab_size=hf.vocab_size, vocab_pad_to=1, hidden_size=hf.d_model,
                    num_layers=hf.num_layers, decoder_layers=hf.num_decoder_layers, num_heads=hf.num_heads,
                    ffn_hidden_size=hf.d_ff, relative_buckets=hf.relative_attention_num_buckets,
                    relative_max_distance=hf.relative_attention_max_distance, type_vocab_size=0,
                    task_type_vocab_size=0, layer_norm_eps=hf.layer_norm_epsilon, hidden_dropout=hf.dropout_rate,
                    attention_dropout=hf.dropout_rate, gated_mlp=gated, activation="gelu_tanh" if gated else "relu",
                    scaled_logits=hf.scale_decoder_outputs)

    def stack_map(self, stack: str, layers: int, gated: bool) -> dict[str, str]:
        """ptm -> HF names of one stack's blocks (QKV and cross-attention K/V apart: they are reshaped)."""
        m = {}
        for i in range(layers):
            keys = dict(_layer_keys(gated), **(CROSS if stack == "decoder" else {}))
            ff = 2 if stack == "decoder" else 1
            m.update({f"{stack}.blocks.{i}.{k}": f"{stack}.block.{i}.{v.format(ff=ff)}" for k, v in keys.items()})
        return m

    def key_map(self, layers: dict, gated: bool) -> dict[str, str]:
        return {**TOP, **self.stack_map("encoder", layers["encoder"], gated),
                **self.stack_map("decoder", layers["decoder"], gated)}

    def from_hf(self, hf: dict, num_layers: int, num_heads: int, vocab_rows: int,
                task_types: bool = False) -> tuple[dict, list[str]]:
        import torch

        layers = _count(hf, r"(encoder|decoder)\.block\.(\d+)\.")
        gated = any(".wi_0." in k for k in hf)
        out, missing = {}, []
        for ours, theirs in self.key_map(layers, gated).items():
            if theirs not in hf:
                missing.append(ours)
                continue
            t = hf[theirs]
            if ours in VOCAB_ROWS and t.shape[0] < vocab_rows:
                t = torch.cat([t, t.new_zeros(vocab_rows - t.shape[0], *t.shape[1:])])
            out[ours] = t.contiguous()
        for stack in ("encoder", "decoder"):
            for i in range(layers[stack]):
                at = f"{stack}.block.{i}.layer."
                q, k, v = (hf[f"{at}0.SelfAttention.{n}.weight"] for n in "qkv")
                out[f"{stack}.blocks.{i}.attn.qkv.weight"] = interleave_qkv(q, k, v, num_heads).contiguous()
                if stack == "decoder":
                    k, v = (hf[f"{at}1.EncDecAttention.{n}.weight"] for n in "kv")
                    out[f"{stack}.blocks.{i}.cross.kv.weight"] = _interleave_kv(k, v, num_heads).contiguous()
        return out, missing

    def to_hf(self, ours: dict, num_layers: int, num_heads: int, vocab_size: int) -> dict:
        import torch

        layers = _count(ours, r"(encoder|decoder)\.blocks\.(\d+)\.")
        gated = any(".mlp.gate." in k for k in ours)
        out = {}
        for mine, theirs in self.key_map(layers, gated).items():
            t = ours[mine][:vocab_size] if mine in VOCAB_ROWS else ours[mine]
            out[theirs] = t.contiguous()
        for stack in ("encoder", "decoder"):
            for i in range(layers[stack]):
                at = f"{stack}.block.{i}.layer."
                q, k, v = split_qkv(ours[f"{stack}.blocks.{i}.attn.qkv.weight"], num_heads)
                out.update({f"{at}0.SelfAttention.{n}.weight": t.contiguous() for n, t in zip("qkv", (q, k, v))})
                if stack == "decoder":
                    kv = ours[f"{stack}.blocks.{i}.cross.kv.weight"]
                    k, v = torch.stack(kv.view(num_heads, 2, -1, kv.shape[-1]).unbind(1)).flatten(1, 2).unbind(0)
                    out.update({f"{at}1.EncDecAttention.k.weight": k.contiguous(),
                                f"{at}1.EncDecAttention.v.weight": v.contiguous()})
        for copy in TIED:
            out[copy] = out["shared.weight"]
        return out


def _interleave_kv(k, v, heads: int):
    """[k; v] -> the per-head layout [heads][2][head_dim, hidden] of ptm's cross-attention kv."""
    import torch

    return torch.stack([k, v]).view(2, heads, -1, k.shape[-1]).transpose(0, 1).reshape(-1, k.shape[-1])


def _count(state: dict, pattern: str) -> dict[str, int]:
    """Blocks per stack in a state dict's names."""
    found = {"encoder": 0, "decoder": 0}
    for key in state:
        m = re.match(pattern, key)
        if m:
            found[m.group(1)] = max(found[m.group(1)], int(m.group(2)) + 1)
    return found


FAMILY = Family("t5", "T5: pre-LN encoder-decoder, RMSNorm, bucketed relative bias, span corruption",
                FEATURES, T5Adapter())
