"""Hugging Face <-> ptm weights as plain key maps (plus the QKV and Conv1D reshapes), on full
(single-rank, fp32) state dicts. Conversions are pure reshapes: HF -> ptm -> HF is bit-exact."""
from __future__ import annotations

import torch

# ptm name -> HF name, per layer "{i}" and for the rest; HF prefix is "bert." / "ernie." / "roberta." / "albert." /
# "electra." / "nezha." / "transformer."
_BERT_LAYER = {
    "attn.out.weight": "attention.output.dense.weight", "attn.out.bias": "attention.output.dense.bias",
    "attn_norm.weight": "attention.output.LayerNorm.weight", "attn_norm.bias": "attention.output.LayerNorm.bias",
    "mlp.fc1.weight": "intermediate.dense.weight", "mlp.fc1.bias": "intermediate.dense.bias",
    "mlp.fc2.weight": "output.dense.weight", "mlp.fc2.bias": "output.dense.bias",
    "mlp_norm.weight": "output.LayerNorm.weight", "mlp_norm.bias": "output.LayerNorm.bias",
}
_BERT = {
    "embeddings.word.weight": "{p}embeddings.word_embeddings.weight",
    "embeddings.position.weight": "{p}embeddings.position_embeddings.weight",
    "embeddings.token_type.weight": "{p}embeddings.token_type_embeddings.weight",
    "embeddings.task_type.weight": "{p}embeddings.task_type_embeddings.weight",
    "embeddings.norm.weight": "{p}embeddings.LayerNorm.weight", "embeddings.norm.bias": "{p}embeddings.LayerNorm.bias",
    "pooler.weight": "{p}pooler.dense.weight", "pooler.bias": "{p}pooler.dense.bias",
    "mlm.dense.weight": "cls.predictions.transform.dense.weight",
    "mlm.dense.bias": "cls.predictions.transform.dense.bias",
    "mlm.norm.weight": "cls.predictions.transform.LayerNorm.weight",
    "mlm.norm.bias": "cls.predictions.transform.LayerNorm.bias",
    "mlm.bias": "cls.predictions.bias",
    "nsp.weight": "cls.seq_relationship.weight", "nsp.bias": "cls.seq_relationship.bias",
}
_ROBERTA_HEAD = {  # RobertaForMaskedLM's lm_head (no pooler, no NSP)
    "mlm.dense.weight": "lm_head.dense.weight", "mlm.dense.bias": "lm_head.dense.bias",
    "mlm.norm.weight": "lm_head.layer_norm.weight", "mlm.norm.bias": "lm_head.layer_norm.bias",
    "mlm.bias": "lm_head.bias",
}
_GPT2_LAYER = {
    "attn_norm.weight": "ln_1.weight", "attn_norm.bias": "ln_1.bias",
    "attn.out.weight": "attn.c_proj.weight", "attn.out.bias": "attn.c_proj.bias",
    "mlp_norm.weight": "ln_2.weight", "mlp_norm.bias": "ln_2.bias",
    "mlp.fc1.weight": "mlp.c_fc.weight", "mlp.fc1.bias": "mlp.c_fc.bias",
    "mlp.fc2.weight": "mlp.c_proj.weight", "mlp.fc2.bias": "mlp.c_proj.bias",
}
_GPT2 = {
    "embeddings.word.weight": "transformer.wte.weight", "embeddings.position.weight": "transformer.wpe.weight",
    "final_norm.weight": "transformer.ln_f.weight", "final_norm.bias": "transformer.ln_f.bias",
}
_ALBERT_LAYER = {  # AlbertForPreTraining, one layer group of one layer (share_layers=all): blocks.0
    "attn.out.weight": "attention.dense.weight", "attn.out.bias": "attention.dense.bias",
    "attn_norm.weight": "attention.LayerNorm.weight", "attn_norm.bias": "attention.LayerNorm.bias",
    "mlp.fc1.weight": "ffn.weight", "mlp.fc1.bias": "ffn.bias",
    "mlp.fc2.weight": "ffn_output.weight", "mlp.fc2.bias": "ffn_output.bias",
    "mlp_norm.weight": "full_layer_layer_norm.weight", "mlp_norm.bias": "full_layer_layer_norm.bias",
}
_ALBERT = {
    "embeddings.proj.weight": "albert.encoder.embedding_hidden_mapping_in.weight",
    "embeddings.proj.bias": "albert.encoder.embedding_hidden_mapping_in.bias",
    "pooler.weight": "albert.pooler.weight", "pooler.bias": "albert.pooler.bias",
    "mlm.dense.weight": "predictions.dense.weight", "mlm.dense.bias": "predictions.dense.bias",
    "mlm.norm.weight": "predictions.LayerNorm.weight", "mlm.norm.bias": "predictions.LayerNorm.bias",
    "mlm.bias": "predictions.bias",
    "nsp.weight": "sop_classifier.classifier.weight", "nsp.bias": "sop_classifier.classifier.bias",
}
_ELECTRA = {  # ElectraForPreTraining (an rtd head) or, for the generator, ElectraForMaskedLM (an mlm head)
    "embeddings.proj.weight": "electra.embeddings_project.weight",
    "embeddings.proj.bias": "electra.embeddings_project.bias",
    "rtd.dense.weight": "discriminator_predictions.dense.weight", "rtd.dense.bias": "discriminator_predictions.dense.bias",
    "rtd.score.weight": "discriminator_predictions.dense_prediction.weight",
    "rtd.score.bias": "discriminator_predictions.dense_prediction.bias",
    "mlm.dense.weight": "generator_predictions.dense.weight", "mlm.dense.bias": "generator_predictions.dense.bias",
    "mlm.norm.weight": "generator_predictions.LayerNorm.weight", "mlm.norm.bias": "generator_predictions.LayerNorm.bias",
    "mlm.bias": "generator_lm_head.bias",
}
ELECTRA_SHARED = ("embeddings.word.weight", "embeddings.position.weight", "embeddings.token_type.weight",
                  "embeddings.norm.weight", "embeddings.norm.bias")  # the generator's, read from the discriminator
_VOCAB_ROWS = ("embeddings.word.weight", "mlm.bias")  # padded to the ptm model's vocabulary


def hf_prefix(arch: str) -> str:
    return {"bert": "bert.", "ernie": "ernie.", "roberta": "roberta.", "albert": "albert.", "electra": "electra.",
            "nezha": "nezha.", "gpt2": "transformer."}[arch]


def _blocks(arch: str, num_layers: int) -> int:
    """ptm blocks that hold parameters: ALBERT's layers share one (share_layers=all, HF's one layer group)."""
    return 1 if arch == "albert" else num_layers


def _layer(arch: str) -> str:
    """HF prefix of layer {i}."""
    if arch == "albert":
        return "albert.encoder.albert_layer_groups.0.albert_layers.{i}."
    return "transformer.h.{i}." if arch == "gpt2" else hf_prefix(arch) + "encoder.layer.{i}."


def _qkv(arch: str) -> str:
    """HF prefix of layer {i}'s query/key/value (GPT-2: its fused c_attn)."""
    return _layer(arch) + {"gpt2": "attn.c_attn", "albert": "attention"}.get(arch, "attention.self")


def key_map(arch: str, num_layers: int, task_types: bool = False) -> dict[str, str]:
    """Every ptm parameter name (except the fused QKV) -> its HF name; `task_types`: ERNIE's use_task_id."""
    if arch == "gpt2":
        m, layer = dict(_GPT2), _GPT2_LAYER
    else:
        p = hf_prefix(arch)
        absent = ("embeddings.task_type.weight",) if not task_types else ()
        absent += ("embeddings.position.weight",) if arch == "nezha" else ()  # relative positions: no table
        m = {k: v.format(p=p) for k, v in _BERT.items() if k not in absent}
        heads = {"roberta": _ROBERTA_HEAD, "albert": _ALBERT, "electra": _ELECTRA}.get(arch)
        if heads:
            m = {k: v for k, v in m.items() if not k.startswith(("mlm.", "pooler.", "nsp."))} | heads
        layer = _ALBERT_LAYER if arch == "albert" else _BERT_LAYER
    m.update({f"blocks.{i}.{k}": _layer(arch).format(i=i) + v for i in range(_blocks(arch, num_layers))
              for k, v in layer.items()})
    return m


def _conv1d(arch: str, ptm_key: str) -> bool:
    """GPT-2's Conv1D stores linear weights transposed ([in, out])."""
    return arch == "gpt2" and ptm_key.endswith("weight") and (".attn." in ptm_key or ".mlp." in ptm_key)


def interleave_qkv(q, k, v, heads: int):
    """[q; k; v] (each [hidden, ...]) -> Megatron's per-head layout [heads][3][head_dim, ...]."""
    stacked = torch.stack([q, k, v])  # [3, hidden, ...]
    rest = stacked.shape[2:]
    return stacked.view(3, heads, -1, *rest).transpose(0, 1).reshape(-1, *rest)


def split_qkv(qkv, heads: int):
    """Inverse of interleave_qkv: -> (q, k, v)."""
    rest = qkv.shape[1:]
    return qkv.view(heads, 3, -1, *rest).transpose(0, 1).reshape(3, -1, *rest).unbind(0)


def from_hf(arch: str, hf: dict, num_layers: int, num_heads: int, vocab_rows: int,
            task_types: bool = False) -> tuple[dict, list[str]]:
    """HF state dict -> ptm state dict; also returns the ptm keys HF did not have (heads to initialise)."""
    out, missing = {}, []
    for ours, theirs in key_map(arch, num_layers, task_types).items():
        if theirs not in hf:
            missing.append(ours)
            continue
        t = hf[theirs]
        if _conv1d(arch, ours):
            t = t.t()
        if ours in _VOCAB_ROWS and t.shape[0] < vocab_rows:
            t = torch.cat([t, t.new_zeros(vocab_rows - t.shape[0], *t.shape[1:])])
        out[ours] = t.contiguous()
    p = _qkv(arch)
    for i in range(_blocks(arch, num_layers)):
        for kind in ("weight", "bias"):
            if arch == "gpt2":
                fused = hf[f"{p.format(i=i)}.{kind}"]
                q, k, v = (fused.t() if kind == "weight" else fused).chunk(3, dim=0)
            else:
                q, k, v = (hf[f"{p.format(i=i)}.{name}.{kind}"] for name in ("query", "key", "value"))
            out[f"blocks.{i}.attn.qkv.{kind}"] = interleave_qkv(q, k, v, num_heads).contiguous()
    return out, missing


def to_hf(arch: str, ours: dict, num_layers: int, num_heads: int, vocab_size: int) -> dict:
    """ptm state dict -> HF state dict (padding rows dropped; tied decoder weights included)."""
    out = {}
    for mine, theirs in key_map(arch, num_layers, "embeddings.task_type.weight" in ours).items():
        if mine not in ours:
            continue
        t = ours[mine]
        if mine in _VOCAB_ROWS:
            t = t[:vocab_size]
        out[theirs] = (t.t() if _conv1d(arch, mine) else t).contiguous()
    p = _qkv(arch)
    for i in range(_blocks(arch, num_layers)):
        for kind in ("weight", "bias"):
            q, k, v = split_qkv(ours[f"blocks.{i}.attn.qkv.{kind}"], num_heads)
            if arch == "gpt2":
                fused = torch.cat([q, k, v])
                out[f"{p.format(i=i)}.{kind}"] = (fused.t() if kind == "weight" else fused).contiguous()
            else:
                for name, t in zip(("query", "key", "value"), (q, k, v)):
                    out[f"{p.format(i=i)}.{name}.{kind}"] = t.contiguous()
    word = out[key_map(arch, num_layers)["embeddings.word.weight"]]
    if arch == "gpt2":
        out["lm_head.weight"] = word
    elif arch == "electra":
        if "mlm.bias" in ours:  # the generator
            out["generator_lm_head.weight"] = word
    elif arch in ("roberta", "albert"):
        head = "lm_head" if arch == "roberta" else "predictions"
        out[f"{head}.decoder.weight"] = word
        out[f"{head}.decoder.bias"] = out[f"{head}.bias"]
    else:
        out["cls.predictions.decoder.weight"] = word
        out["cls.predictions.decoder.bias"] = out["cls.predictions.bias"]
    return out


def electra_split(ours: dict) -> tuple[dict, dict]:
    """An ELECTRA state dict -> (the discriminator's, the generator's), each a whole model's: the generator gets the
    discriminator's embedding tables, which it reads in ptm."""
    disc = {k: v for k, v in ours.items() if not k.startswith("generator.")}
    gen = {k.removeprefix("generator."): v for k, v in ours.items() if k.startswith("generator.")}
    return disc, gen | {k: ours[k] for k in ELECTRA_SHARED if k in ours}


def electra_join(disc: dict, gen: dict) -> dict:
    """Inverse of electra_split: the generator's own parameters under `generator.` (its embedding tables are the
    discriminator's)."""
    return disc | {f"generator.{k}": v for k, v in gen.items() if k not in ELECTRA_SHARED}
