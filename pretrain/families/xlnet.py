"""XLNet (Yang et al. 2019): post-LN blocks of two-stream relative attention over a memory (pretrain/models/two_stream.py),
GELU, XLNet's relative segment encodings, the tied LM head with a bias; permutation language modelling. The
Transformer-XL style (causal, with memory, no permutation; no adaptive softmax) is the same model with
`model.causal: true`. Exports as XLNetLMHeadModel (attn_type bi, or uni when causal) and imports it and XLNetModel."""
from __future__ import annotations

from pretrain.families.base import (VOCAB_ROWS, Adapter, Cost, ExportError, Family, hf_special_tokens,
                                    interleave_heads, split_heads, take, with_offsets_kept)
from pretrain.schema import opt
from pretrain.stacks import Stack

ORDER = 120
OWN_ROWS = ("lm_bias",)  # its LM head's bias, a row per vocabulary entry
ROWS = VOCAB_ROWS + OWN_ROWS
SECTION = (  # the model fields only XLNet / Transformer-XL read: its config section
    ("clamp_len", int, opt(-1, "position_encoding=transformer_xl: distances beyond this are clamped to it; -1 "
        "(or 0, as transformers' XLNet reads it): none")),
    ("mem_len", int, opt(0, "Transformer-XL / XLNet memory: each layer also attends to the last mem_len inputs it had "
        "(the previous segments of the same stream, detached); 0: none", range=">= 0")),
    ("reuse_len", int, opt(0, "XLNet memory: each sample's first reuse_len tokens continue its stream and are what the "
        "memory keeps (the rest is A and B; XLNet: 256 of 512); 0: every token", range=">= 0")),
    ("relative_segments", bool | None, opt(None, "XLNet's segment term in attention (same segment or not, learned per "
        "head) instead of segment embeddings; null: the arch's")),
)
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
    tokenizer = "none"  # (its own: `own_tokenizer`)
    tokenizer_class = "XLNetTokenizer"
    keys = {"embeddings.word.weight": "transformer.word_embedding.weight", "lm_bias": "lm_loss.bias"}

    def own_tokenizer(self, tok, meta: dict):
        """XLNet's: A [SEP] [CLS], a pair A [SEP] B [SEP] [CLS] (segments 0, 1 and the [CLS]'s 2), padded on the left
        (the last token, [CLS], stays where XLNet pretrained it)."""
        import transformers
        from tokenizers import processors

        ids = meta["special_ids"]
        special = hf_special_tokens(ids, tok.id_to_token, "unk", "pad", "sep", "cls", "mask", null=True, bos="cls",
                                    eos="sep")  # (bos and eos: its config's, else XLNet's class names <s> and </s>)
        sep, cls = special["sep_token"], special["cls_token"]
        tok.post_processor = with_offsets_kept(tok, processors.TemplateProcessing(
            single=f"$A {sep} {cls}:2", pair=f"$A {sep} $B:1 {sep}:1 {cls}:2",
            special_tokens=[(sep, ids["sep"]), (cls, ids["cls"])]))
        return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **special, padding_side="left",
                                                    model_input_names=["input_ids", "token_type_ids", "attention_mask"])

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
        out, missing = take(hf, self.key_map(num_layers), vocab_rows, ROWS)
        out["query_start"] = hf["transformer.mask_emb"].flatten().contiguous()
        for i in range(num_layers):
            at, mine = LAYER.format(i=i) + "rel_attn.", f"blocks.{i}.attn."
            width = hf[at + "q"].shape[0]
            linear = {n: hf[at + n].reshape(width, -1).t() for n in ("q", "k", "v", "r")}
            out.update({f"{mine}{n}.weight": linear[n].contiguous() for n in PROJECTIONS})
            out[mine + "kv.weight"] = interleave_heads((linear["k"], linear["v"]), num_heads).contiguous()
            out[mine + "out.weight"] = hf[at + "o"].reshape(width, -1).contiguous()
        return out, missing

    def to_hf(self, ours, num_layers, num_heads, vocab_size):
        out = {theirs: (ours[mine][:vocab_size] if mine in ROWS else ours[mine]).contiguous()
               for mine, theirs in self.key_map(num_layers).items()}
        width = ours["query_start"].shape[0]
        out["transformer.mask_emb"] = ours["query_start"].view(1, 1, width).contiguous()
        for i in range(num_layers):
            at, mine = LAYER.format(i=i) + "rel_attn.", f"blocks.{i}.attn."
            linear = {n: ours[f"{mine}{n}.weight"] for n in PROJECTIONS}
            linear["k"], linear["v"] = split_heads(ours[mine + "kv.weight"], num_heads, 2)
            out.update({at + n: t.t().reshape(width, num_heads, -1).contiguous() for n, t in linear.items()})
            out[at + "o"] = ours[mine + "out.weight"].reshape(width, num_heads, -1).contiguous()
        out["lm_loss.weight"] = out["transformer.word_embedding.weight"]
        return out

    def key_map(self, num_layers: int, task_types: bool = False) -> dict[str, str]:
        m = dict(self.keys)
        for i in range(num_layers):
            m.update({f"blocks.{i}.{k}": LAYER.format(i=i) + v for k, v in PLAIN.items()})
        return m


def check(cfg, need, objective) -> None:
    """XLNet's segments are relative (no segment table); a memory and its reuse are XLNet's and Transformer-XL's, and
    a memory is carried along the streams of a recurrent objective's samples."""
    m, d = cfg.model, cfg.data
    wrong = [f"a data.objective whose samples stream (XLNet's plm, Transformer-XL's clm; not {objective.name})"
             ] * (not objective.recurrent) + [f"one data.path (not {len(d.paths)})"] * (len(d.paths) != 1) + [
             "data.pack_documents=true"] * (not d.pack_documents)
    need(not m.mem_len or not wrong,
         f"model.mem_len={m.mem_len} carries a memory along streams of one dataset's packed documents: it needs "
         f"{' and '.join(wrong)}; or set model.mem_len=0")
    need(m.position_encoding != "transformer_xl" or m.type_vocab_size == 0,
         f"model.type_vocab_size={m.type_vocab_size}: XLNet's segments enter attention (model.relative_segments), "
         f"not as embeddings; set model.type_vocab_size=0")
    need(not m.mem_len or m.position_encoding == "transformer_xl",
         f"model.mem_len={m.mem_len}: a memory of earlier segments is XLNet's and Transformer-XL's (model.arch=xlnet); "
         f"set model.mem_len=0")
    need(not m.reuse_len or (m.position_encoding == "transformer_xl" and not m.causal),
         f"model.reuse_len={m.reuse_len} is XLNet's (permutation LM) reuse; a causal model keeps every position: set "
         f"model.reuse_len=0")


def layer_flops(stack: Stack) -> int:
    """Training FLOPs of one XLNet / Transformer-XL layer on one sequence of s tokens, with k = s + mem_len keys and
    R = k + s relative positions: per query token of either stream (the content stream's s, the query stream's
    `queries`) its query, output and MLP matmuls (2ha + 2hf), scores and weighted sum over the keys (2ka), the position
    term over R (Ra) and, where the samples have segments (XLNet's, which run the query stream), the segment term
    (2a); per sequence the keys and values (2kha). The position keys' projection (Rha) runs once per micro-batch,
    whatever its size: left out."""
    m, s, queries = stack.model, stack.seq_len, stack.queries
    h, f, a = m.hidden_size, m.ffn_hidden_size, m.attention_width
    k = s + stack.memory
    r = k + s
    segments = 2 if m.relative_segments and queries else 0
    per_query = 2 * h * a + (3 if m.gated_mlp else 2) * h * f + (2 * k + r + segments) * a
    return 6 * ((s + queries) * per_query + 2 * k * h * a)


class XLNetCost(Cost):
    """One stack whose attention reads a memory and keeps its probabilities (relative positions in plain matmuls),
    with XLNet's query stream on the predicted tokens (none when causal: Transformer-XL predicts from its content
    stream); no attention biases, but the position keys' projection, u and v per head, and the segment term's."""

    def stacks(self, m, seq_len, decoder, predicted):
        return [Stack(m, m.num_layers, seq_len, queries=0 if m.causal else predicted, memory=m.mem_len,
                      keeps_scores=True, layer=layer_flops)]

    def layer_modules(self, m, layer):
        h, a = m.hidden_size, m.attention_width  # q, kv and r; u, v and with relative segments s and its 2 vectors
        return {**layer, "attention": [(4 * h * a + (5 if m.relative_segments else 2) * a, 0), (a * h, 0)]}

    def more_modules(self, m, layer, shared):
        return [(shared["vocab"], 0), (0, m.hidden_size)]  # the LM head's bias (vocab-split), the query stream's start

    def carried_bytes(self, cfg, dp):
        """mem_len states per layer for each of its data-parallel rank's streams (global batch / dp), in the model's
        dtype, with their mask and stamps (pretrain/models/recurrence.py)."""
        m = cfg.model
        if not m.mem_len:
            return 0
        streams = cfg.train.global_batch_size // dp
        return streams * (m.num_layers * m.mem_len * m.hidden_size * (4 if cfg.precision == "fp32" else 2)
                          + m.mem_len + 24)


def idle(m) -> tuple[str, ...]:
    """A causal model (Transformer-XL) runs no query stream and reads no segments (a causal LM's samples have none):
    the query stream's input and the segment terms stay as initialised, for XLNetLMHeadModel's export."""
    if not m.causal:
        return ()
    segments = (f"blocks.{i}.attn.{n}" for i in range(m.num_layers) for n in ("segment_bias", "segments"))
    return ("query_start", *(segments if m.relative_segments else ()))


FAMILY = Family("xlnet", "XLNet / Transformer-XL: two-stream relative attention with memory, permutation LM",
                FEATURES, XLNetAdapter(), check, model="pretrain.models.two_stream:XLNet", cost=XLNetCost(),
                section=SECTION, vocab_rows=OWN_ROWS, idle=idle)
