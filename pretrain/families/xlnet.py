"""XLNet (Yang et al. 2019): post-LN blocks of two-stream relative attention over a memory (pretrain/models/xlnet.py),
GELU, XLNet's relative segment encodings, the tied LM head with a bias; permutation language modelling. The
Transformer-XL style (causal, with memory, no permutation; no adaptive softmax) is the same model with
`model.causal: true`. Exports as XLNetLMHeadModel (attn_type bi, or uni when causal) and imports it and XLNetModel."""
from __future__ import annotations

from pretrain.families.base import VOCAB_ROWS, Adapter, ExportError, Family, take
from pretrain.families.seq2seq import interleave_kv, split_kv

ORDER = 120
FEATURES = dict(norm="post", activation="gelu", causal=False, heads=["lm"], scaled_init=False,
                position_encoding="transformer_xl", share_layers="none", embedding_norm=False, relative_segments=True)
ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}  # ptm -> XLNetConfig.ff_activation
COMPUTES = dict(norm=("post",), activation=tuple(ACTIVATIONS), causal=(False, True), heads=("lm",),
                position_encoding=("transformer_xl",), share_layers=("none",), embedding_norm=(None, False),
                relative_segments=(True,), embedding_size=(0,), type_vocab_size=(0,), task_type_vocab_size=(0,))
LAYER = "transformer.layer.{i}."
PLAIN = {  # ptm block parameter -> HF name in the layer, same tensor
    "attn_norm.weight": "rel_attn.layer_norm.weight", "attn_norm.bias": "rel_attn.layer_norm.bias",
    "attn.content_bias": "rel_attn.r_w_bias", "attn.position_bias": "rel_attn.r_r_bias",
    "attn.segment_bias": "rel_attn.r_s_bias", "attn.segments": "rel_attn.seg_embed",
    "mlp.fc1.weight": "ff.layer_1.weight", "mlp.fc1.bias": "ff.layer_1.bias",
    "mlp.fc2.weight": "ff.layer_2.weight", "mlp.fc2.bias": "ff.layer_2.bias",
    "mlp_norm.weight": "ff.layer_norm.weight", "mlp_norm.bias": "ff.layer_norm.bias"}
PROJECTIONS = ("q", "r")  # HF [hidden, heads, head_dim] einsum weights that are ptm column-parallel linears


class XLNetAdapter(Adapter):
    hf_class = "XLNetLMHeadModel"
    model_type = "xlnet"
    computes = COMPUTES
    tokenizer = "xlnet"  # A [SEP] B [SEP] [CLS], padded on the left
    keys = {"embeddings.word.weight": "transformer.word_embedding.weight", "lm_bias": "lm_loss.bias"}

    def hf_config(self, cfg, special):
        import transformers

        if cfg.attention_dropout != cfg.hidden_dropout:
            raise ExportError(f"model.attention_dropout={cfg.attention_dropout} differs from model.hidden_dropout="
                              f"{cfg.hidden_dropout}: XLNetConfig has one dropout; set them equal")
        return transformers.XLNetConfig(
            vocab_size=cfg.vocab_size, d_model=cfg.hidden_size, n_layer=cfg.num_layers, n_head=cfg.num_heads,
            d_inner=cfg.ffn_hidden_size, ff_activation=ACTIVATIONS[cfg.activation],
            attn_type="uni" if cfg.causal else "bi", initializer_range=cfg.init_std, layer_norm_eps=cfg.layer_norm_eps,
            dropout=cfg.hidden_dropout, mem_len=cfg.mem_len or None, reuse_len=cfg.reuse_len or None, clamp_len=cfg.clamp_len, bi_data=False,
            same_length=False, pad_token_id=special.get("pad", 5), bos_token_id=special.get("cls", 1),
            eos_token_id=special.get("sep", 2), architectures=[self.hf_class])

    def model_config(self, hf):
        if hf.bi_data or hf.same_length:
            raise ExportError(f"bi_data={hf.bi_data}, same_length={hf.same_length}: ptm's XLNet has neither (the "
                              f"released models were trained with both off)")
        activation = {v: k for k, v in ACTIVATIONS.items()}.get(hf.ff_activation)
        if activation is None:
            raise ExportError(f"ff_activation={hf.ff_activation!r}: ptm's XLNet has {', '.join(ACTIVATIONS.values())}")
        return dict(arch="xlnet", vocab_size=hf.vocab_size, vocab_pad_to=1, hidden_size=hf.d_model,
                    num_layers=hf.n_layer, num_heads=hf.n_head, ffn_hidden_size=hf.d_inner, activation=activation,
                    causal=hf.attn_type == "uni", mem_len=hf.mem_len or 0, reuse_len=hf.reuse_len or 0, clamp_len=hf.clamp_len, type_vocab_size=0,
                    task_type_vocab_size=0, layer_norm_eps=hf.layer_norm_eps, hidden_dropout=hf.dropout,
                    attention_dropout=hf.dropout, init_std=hf.initializer_range)

    def from_hf(self, hf, num_layers, num_heads, vocab_rows, task_types=False):
        hf = {k if k.startswith(("transformer.", "lm_loss.")) else f"transformer.{k}": v for k, v in hf.items()}
        out, missing = take(hf, self.key_map(num_layers), vocab_rows)
        out["query_start"] = hf["transformer.mask_emb"].flatten().contiguous()
        for i in range(num_layers):
            at, mine = LAYER.format(i=i) + "rel_attn.", f"blocks.{i}.attn."
            width = hf[at + "q"].shape[0]
            linear = {n: hf[at + n].reshape(width, -1).t() for n in ("q", "k", "v", "r")}
            out.update({f"{mine}{n}.weight": linear[n].contiguous() for n in PROJECTIONS})
            out[mine + "kv.weight"] = interleave_kv(linear["k"], linear["v"], num_heads).contiguous()
            out[mine + "out.weight"] = hf[at + "o"].reshape(width, -1).contiguous()
        return out, missing

    def to_hf(self, ours, num_layers, num_heads, vocab_size):
        out = {theirs: (ours[mine][:vocab_size] if mine in VOCAB_ROWS else ours[mine]).contiguous()
               for mine, theirs in self.key_map(num_layers).items()}
        width = ours["query_start"].shape[0]
        out["transformer.mask_emb"] = ours["query_start"].view(1, 1, width).contiguous()
        for i in range(num_layers):
            at, mine = LAYER.format(i=i) + "rel_attn.", f"blocks.{i}.attn."
            linear = {n: ours[f"{mine}{n}.weight"] for n in PROJECTIONS}
            linear["k"], linear["v"] = split_kv(ours[mine + "kv.weight"], num_heads)
            out.update({at + n: t.t().reshape(width, num_heads, -1).contiguous() for n, t in linear.items()})
            out[at + "o"] = ours[mine + "out.weight"].reshape(width, num_heads, -1).contiguous()
        out["lm_loss.weight"] = out["transformer.word_embedding.weight"]
        return out

    def key_map(self, num_layers: int, task_types: bool = False) -> dict[str, str]:
        m = dict(self.keys)
        for i in range(num_layers):
            m.update({f"blocks.{i}.{k}": LAYER.format(i=i) + v for k, v in PLAIN.items()})
        return m


def check(cfg, need) -> None:
    """XLNet's segments are relative (no segment table); a memory and its reuse are XLNet's and Transformer-XL's."""
    m = cfg.model
    need(m.position_encoding != "transformer_xl" or m.type_vocab_size == 0,
         f"model.type_vocab_size={m.type_vocab_size}: XLNet's segments enter attention (model.relative_segments), "
         f"not as embeddings; set model.type_vocab_size=0")
    need(not m.mem_len or m.position_encoding == "transformer_xl",
         f"model.mem_len={m.mem_len}: a memory of earlier segments is XLNet's and Transformer-XL's (model.arch=xlnet); "
         f"set model.mem_len=0")
    need(not m.reuse_len or (m.position_encoding == "transformer_xl" and not m.causal),
         f"model.reuse_len={m.reuse_len} is XLNet's (permutation LM) reuse; a causal model keeps every position: set "
         f"model.reuse_len=0")


FAMILY = Family("xlnet", "XLNet / Transformer-XL: two-stream relative attention with memory, permutation LM",
                FEATURES, XLNetAdapter(), check)
