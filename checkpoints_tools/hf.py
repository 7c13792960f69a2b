"""Hugging Face export and import: configs, weights (via `hf_keys`) and tokenizers, both ways."""
from __future__ import annotations

import json
import os
import shutil

import torch

from checkpoints_tools import hf_keys
from pretrain import checkpoint as C
from pretrain.models.config import ModelConfig, embedding_width, generator_config

_HF_CLASSES = {"bert": "BertForPreTraining", "ernie": "ErnieForPreTraining", "roberta": "RobertaForMaskedLM",
               "albert": "AlbertForPreTraining", "electra": "ElectraForPreTraining", "nezha": "NezhaForPreTraining",
               "gpt2": "GPT2LMHeadModel"}
ELECTRA_GENERATOR = ("generator", "ElectraForMaskedLM")  # ELECTRA's export: the generator in this subdirectory
NEZHA_AUTO_MAP = {"AutoConfig": "configuration_nezha.NezhaConfig", "AutoModel": "modeling_nezha.NezhaModel",
                  "AutoModelForPreTraining": "modeling_nezha.NezhaForPreTraining",
                  "AutoModelForMaskedLM": "modeling_nezha.NezhaForMaskedLM"}  # transformers ships no NEZHA: ours
ELECTRA_GENERATOR_SIZE = 0.25  # the generator made for a discriminator imported alone (ELECTRA-small's and -large's)
_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new"}  # ptm -> HF hidden_act


def hf_config(cfg: ModelConfig, special: dict):
    import transformers

    if cfg.arch == "gpt2":
        eod = special.get("eod")
        return transformers.GPT2Config(
            vocab_size=cfg.vocab_size, n_positions=cfg.max_position_embeddings, n_embd=cfg.hidden_size,
            n_layer=cfg.num_layers, n_head=cfg.num_heads, activation_function="gelu_new",
            n_inner=None if cfg.ffn_hidden_size == 4 * cfg.hidden_size else cfg.ffn_hidden_size,
            resid_pdrop=cfg.hidden_dropout, embd_pdrop=cfg.hidden_dropout, attn_pdrop=cfg.attention_dropout,
            layer_norm_epsilon=cfg.layer_norm_eps, initializer_range=cfg.init_std, bos_token_id=eod, eos_token_id=eod,
            architectures=[_HF_CLASSES["gpt2"]])
    common = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.ffn_hidden_size,
        hidden_act=_ACTIVATIONS[cfg.activation],
        hidden_dropout_prob=cfg.hidden_dropout, attention_probs_dropout_prob=cfg.attention_dropout,
        max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=cfg.type_vocab_size,
        layer_norm_eps=cfg.layer_norm_eps, initializer_range=cfg.init_std, pad_token_id=special.get("pad", 0),
        architectures=[_HF_CLASSES[cfg.arch]])
    if cfg.arch == "albert":  # every layer is the one shared layer: one group of one layer
        if cfg.share_layers != "all":
            raise C.CheckpointError(f"Hugging Face's ALBERT shares whole layers; a model with share_layers="
                                    f"{cfg.share_layers} has no HF class: keep it in ptm's format, or train with "
                                    "share_layers=all to export it")
        return transformers.AlbertConfig(embedding_size=embedding_width(cfg), num_hidden_groups=1,
                                         inner_group_num=1, bos_token_id=special.get("cls"),
                                         eos_token_id=special.get("sep"), **common)
    if cfg.arch == "electra":  # the discriminator, or with an mlm head the generator (ElectraForMaskedLM)
        if "mlm" in cfg.heads:
            common["architectures"] = [ELECTRA_GENERATOR[1]]
        return transformers.ElectraConfig(embedding_size=embedding_width(cfg), **common)
    if cfg.arch == "nezha":  # ptm's own classes (checkpoints_tools/nezha), written next to the weights
        from checkpoints_tools.nezha.configuration_nezha import NezhaConfig

        return NezhaConfig(max_relative_position=cfg.max_relative_position, auto_map=NEZHA_AUTO_MAP, **common)
    if cfg.arch == "roberta":  # positions from pad_token_id + 1: the model's padding id, the tokenizer's
        common.update(pad_token_id=cfg.pad_token_id, bos_token_id=special.get("cls"), eos_token_id=special.get("sep"))
        return transformers.RobertaConfig(**common)
    if cfg.arch == "ernie":
        return transformers.ErnieConfig(use_task_id=cfg.task_type_vocab_size > 0,
                                        task_type_vocab_size=max(cfg.task_type_vocab_size, 1), **common)
    return transformers.BertConfig(**common)


def model_config_from_hf(hf, generator=None) -> ModelConfig:
    """The ptm model of an HF config (ELECTRA: the discriminator's, sized with its `generator`'s; without one, a
    generator of ELECTRA_GENERATOR_SIZE)."""
    if hf.model_type == "gpt2":
        return ModelConfig(arch="gpt2", vocab_size=hf.vocab_size, vocab_pad_to=1, hidden_size=hf.n_embd,
                           num_layers=hf.n_layer, num_heads=hf.n_head, ffn_hidden_size=hf.n_inner or 4 * hf.n_embd,
                           max_position_embeddings=hf.n_positions, type_vocab_size=0, task_type_vocab_size=0,
                           layer_norm_eps=hf.layer_norm_epsilon, hidden_dropout=hf.resid_pdrop,
                           attention_dropout=hf.attn_pdrop, init_std=hf.initializer_range)
    if hf.model_type not in ("bert", "ernie", "roberta", "albert", "electra", "nezha"):
        raise C.CheckpointError(f"model type {hf.model_type!r} is not supported; ptm imports bert, ernie, roberta, "
                                "albert, electra, nezha and gpt2")
    activation = {v: k for k, v in _ACTIVATIONS.items()}.get(hf.hidden_act)
    if activation is None:
        raise C.CheckpointError(f"hidden_act={hf.hidden_act!r} is not one ptm has ({', '.join(_ACTIVATIONS.values())})")
    extra = {}
    if hf.model_type == "albert":
        if (hf.num_hidden_groups, hf.inner_group_num) != (1, 1):
            raise C.CheckpointError(f"ALBERT with num_hidden_groups={hf.num_hidden_groups}, inner_group_num="
                                    f"{hf.inner_group_num}: ptm imports one shared layer (1, 1), as every released "
                                    "ALBERT has")
    if hf.model_type == "nezha":
        extra["max_relative_position"] = hf.max_relative_position
    if hf.model_type in ("albert", "electra"):
        extra["embedding_size"] = hf.embedding_size if hf.embedding_size != hf.hidden_size else 0
    if hf.model_type == "electra":
        if ELECTRA_GENERATOR[1] in (hf.architectures or []):
            raise C.CheckpointError(f"this is ELECTRA's generator ({ELECTRA_GENERATOR[1]}); pass the discriminator's "
                                    f"directory (ElectraForPreTraining), with the generator in its "
                                    f"{ELECTRA_GENERATOR[0]}/ subdirectory")
        extra["generator_size"] = generator.hidden_size / hf.hidden_size if generator else ELECTRA_GENERATOR_SIZE
    task = hf.task_type_vocab_size if getattr(hf, "use_task_id", False) else 0
    pad = hf.pad_token_id if hf.model_type == "roberta" else -1
    cfg = ModelConfig(arch=hf.model_type, pad_token_id=pad, activation=activation, **extra,
                      vocab_size=hf.vocab_size, vocab_pad_to=1, hidden_size=hf.hidden_size,
                      num_layers=hf.num_hidden_layers, num_heads=hf.num_attention_heads,
                      ffn_hidden_size=hf.intermediate_size, max_position_embeddings=hf.max_position_embeddings,
                      type_vocab_size=hf.type_vocab_size, task_type_vocab_size=task,
                      layer_norm_eps=hf.layer_norm_eps, hidden_dropout=hf.hidden_dropout_prob,
                      attention_dropout=hf.attention_probs_dropout_prob, init_std=hf.initializer_range)
    if generator is not None:
        g = generator_config(cfg)
        theirs = (generator.hidden_size, generator.num_attention_heads, generator.intermediate_size,
                  generator.num_hidden_layers, generator.embedding_size)
        if (g.hidden_size, g.num_heads, g.ffn_hidden_size, g.num_layers, g.embedding_size) != theirs:
            raise C.CheckpointError(f"the generator's sizes (hidden, heads, MLP, layers, embedding: {theirs}) are not "
                                    f"the discriminator's scaled by {cfg.generator_size:.4g}; ptm's generator is "
                                    "model.generator_size times as wide and as deep, on the same embeddings")
    return cfg


# ---- tokenizers -------------------------------------------------------------------------------------

def export_tokenizer(tok_dir: str, out: str, arch: str, nfkc: bool, max_length: int) -> None:
    """The dataset's tokenizer as a Hugging Face fast tokenizer (tokenizer.json + tokenizer_config.json);
    the original files are copied too, so `from-hf` brings the same tokenizer back."""
    import transformers

    with open(os.path.join(tok_dir, "ptm_tokenizer.json")) as f:
        meta = json.load(f)
    files = [os.path.join(tok_dir, name) for name in meta["files"]]
    if meta["kind"] == "wordpiece":
        hf = transformers.BertTokenizerFast.from_pretrained(tok_dir, do_lower_case=meta["lowercase"])
    elif meta["kind"] == "bpe":  # RoBERTa's adds <s> A </s></s> B </s> around the same byte-level BPE
        cls = transformers.RobertaTokenizerFast if arch == "roberta" else transformers.GPT2TokenizerFast
        hf = cls.from_pretrained(tok_dir)
    else:
        inputs = ["input_ids", "attention_mask"] + ([] if arch in ("gpt2", "roberta") else ["token_type_ids"])
        hf = transformers.PreTrainedTokenizerFast(tokenizer_object=_sentencepiece_to_fast(files[0], arch),
                                                  unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                                  sep_token="[SEP]", mask_token="[MASK]", model_input_names=inputs)
    if nfkc:  # data_prep normalised the text with NFKC before tokenizing; the exported tokenizer does too
        from tokenizers import normalizers

        backend = hf.backend_tokenizer
        backend.normalizer = normalizers.Sequence(
            [normalizers.NFKC()] + ([backend.normalizer] if backend.normalizer is not None else []))
    hf.model_max_length = max_length
    hf.save_pretrained(out)
    for path in files:
        shutil.copy(path, out)
    shutil.copy(os.path.join(tok_dir, "ptm_tokenizer.json"), out)


def _sentencepiece_to_fast(model_file: str, arch: str):
    """transformers' own sentencepiece converter (ids identical to sentencepiece's), with byte fallback
    decoding and, for bidirectional models, BERT's [CLS] A [SEP] B [SEP] template (RoBERTa's [CLS] A [SEP] [SEP] B
    [SEP], one segment type)."""
    from tokenizers import decoders, processors
    from transformers.convert_slow_tokenizer import SpmConverter

    class Converter(SpmConverter):
        handle_byte_fallback = True

    class Source:
        vocab_file = model_file
        legacy = True

    tok = Converter(Source()).converted()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1)])
    if arch != "gpt2":
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        pair = "[CLS] $A [SEP] [SEP] $B [SEP]" if arch == "roberta" else "[CLS] $A [SEP] $B:1 [SEP]:1"
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair=pair, special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


def import_tokenizer(hf_dir: str, out: str) -> None:
    """A ptm tokenizer directory from a Hugging Face model directory."""
    from data_prep.tokenizer import META, load_tokenizer

    if os.path.isfile(os.path.join(hf_dir, META)):
        source = hf_dir
    else:
        if os.path.isfile(os.path.join(hf_dir, "tokenizer.json")):  # newer transformers save only this file
            from tokenizers import Tokenizer

            os.makedirs(out, exist_ok=True)
            Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json")).model.save(out)
            hf_dir = out  # vocab.txt (WordPiece) or vocab.json + merges.txt (BPE) now live here
        names = sorted(os.listdir(hf_dir))
        source = next((os.path.join(hf_dir, n) for n in names if n.endswith(".model")), None) or (
            os.path.join(hf_dir, "vocab.txt") if "vocab.txt" in names else
            os.path.join(hf_dir, "vocab.json") if "vocab.json" in names else None)
        if source is None:
            raise C.CheckpointError(f"{hf_dir} has no tokenizer files ptm can use (a sentencepiece .model, "
                                    "vocab.txt or vocab.json + merges.txt)")
    load_tokenizer(source).save(out)


# ---- checkpoints ------------------------------------------------------------------------------------

def to_hf(ckpt_or_run: str, out: str, max_shard_size: str = "2GB") -> str:
    """Write a transformers model directory (config, safetensors weights, tokenizer) from a ptm checkpoint (ELECTRA:
    the discriminator, and the generator in its `generator` subdirectory)."""
    ckpt = C.check_complete(C.resolve(ckpt_or_run))
    meta = C.read_meta(ckpt)
    cfg = C.model_config(meta)
    tok_dir = os.path.join(ckpt, "tokenizer")
    with open(os.path.join(tok_dir, "ptm_tokenizer.json")) as f:
        special = json.load(f)["special_ids"]
    models = [(cfg, out, _HF_CLASSES[cfg.arch])]
    if cfg.arch == "electra":  # the discriminator in `out`, the generator in out/generator
        models.append((generator_config(cfg), os.path.join(out, ELECTRA_GENERATOR[0]), ELECTRA_GENERATOR[1]))
    configs = [hf_config(m, special) for m, _, _ in models]  # first: it refuses what HF has no class for
    state = C.load_full_model(ckpt)
    states = hf_keys.electra_split(state) if cfg.arch == "electra" else (state,)
    for (model_cfg, where, cls), config, weights in zip(models, configs, states):
        _write_hf(model_cfg, config, weights, cls, where, meta, ckpt, max_shard_size)
        export_tokenizer(tok_dir, where, cfg.arch, meta.get("nfkc", False), cfg.max_position_embeddings)
    return out


def _write_hf(cfg: ModelConfig, config, state: dict, cls: str, out: str, meta: dict, ckpt: str,
              max_shard_size: str) -> None:
    """One transformers model `cls` of `config` holding ptm weights `state`, saved to `out`."""
    weights = hf_keys.to_hf(cfg.arch, state, cfg.num_layers, cfg.num_heads, cfg.vocab_size)
    for key, value in meta.get("hf_token_ids", {}).items():  # imported models keep their own special ids
        setattr(config, key, value)
    model = _hf_class(cls)(config)
    result = model.load_state_dict(weights, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith(("position_ids", ".attn.bias", ".attn.masked_bias"))]
    if missing or result.unexpected_keys:
        raise C.CheckpointError(f"{ckpt} does not fit {cls}: missing {missing[:5]}, "
                                f"unexpected {result.unexpected_keys[:5]}")
    model.save_pretrained(out, max_shard_size=max_shard_size)
    if cfg.arch == "nezha":  # the modeling code travels with the weights (config.json's auto_map names it)
        for name in ("configuration_nezha.py", "modeling_nezha.py"):
            shutil.copy(os.path.join(os.path.dirname(__file__), "nezha", name), out)


def from_hf(hf_dir: str, out: str) -> tuple[str, list[str]]:
    """A ptm checkpoint (step 0) from a transformers directory; returns it and the heads that HF did not
    have and were initialised (base models such as BertModel or GPT2Model)."""
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        what = "has no config.json" if os.path.isdir(hf_dir) else "is not a directory"
        raise C.CheckpointError(f"{hf_dir} {what}: not a Hugging Face model directory; pass the directory that "
                                "save_pretrained wrote (config.json, weights, tokenizer files)")
    hf_cfg = _auto_config(hf_dir)
    gen_dir = os.path.join(hf_dir, ELECTRA_GENERATOR[0])
    gen_cfg = _auto_config(gen_dir) \
        if hf_cfg.model_type == "electra" and os.path.isfile(os.path.join(gen_dir, "config.json")) else None
    cfg = model_config_from_hf(hf_cfg, gen_cfg)
    state, initialised = _import_weights(cfg, hf_dir, _HF_CLASSES[cfg.arch])
    if cfg.arch == "electra":  # the generator from generator/, else a new one
        g = generator_config(cfg)
        if gen_cfg is not None:
            gen, missing = _import_weights(g, gen_dir, ELECTRA_GENERATOR[1])
        else:  # a new generator: its own layers, the discriminator's embedding tables
            from pretrain.models.model import Pretraining
            from pretrain.parallel import mcore

            mcore.initialize(1, 0)
            torch.manual_seed(0)
            gen = {k: p.detach() for k, p in Pretraining(g).named_parameters() if k not in hf_keys.ELECTRA_SHARED}
            missing = [f"generator.{k}" for k in gen]
        state, initialised = hf_keys.electra_join(state, gen), initialised + missing
    os.makedirs(out, exist_ok=True)
    C.save_model(out, state)
    import_tokenizer(hf_dir, os.path.join(out, "tokenizer"))
    token_ids = {k: getattr(hf_cfg, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                 if getattr(hf_cfg, k, None) is not None}
    C.write_meta(out, model=cfg, params=_params(cfg, state),
                 extra={"source": os.path.abspath(hf_dir), "initialised": initialised, "nfkc": _uses_nfkc(hf_dir),
                        "hf_token_ids": token_ids})
    return out, initialised


def _import_weights(cfg: ModelConfig, hf_dir: str, cls: str) -> tuple[dict, list[str]]:
    """The ptm state dict of the HF model `cls` in `hf_dir`, and what HF lacked (initialised)."""
    torch.manual_seed(0)
    model, info = _hf_class(cls).from_pretrained(hf_dir, output_loading_info=True)
    state, missing = hf_keys.from_hf(cfg.arch, model.state_dict(), cfg.num_layers, cfg.num_heads, cfg.vocab_size,
                                     task_types=cfg.task_type_vocab_size > 0)
    absent = ("mlm." if "rtd" in cfg.heads else "rtd.",)  # ELECTRA's key map names both models' heads
    absent += ("embeddings.proj.",) if embedding_width(cfg) == cfg.hidden_size else ()  # and the projection
    missing = [k for k in missing if not k.startswith(absent)]
    return state, sorted(k for k in info["missing_keys"] if not k.endswith("position_ids")) + missing


def _hf_class(name: str):
    """A transformers model class by name; NEZHA's from ptm's modeling file (never from the directory imported)."""
    if name.startswith("Nezha"):
        from checkpoints_tools.nezha import modeling_nezha

        return getattr(modeling_nezha, name)
    import transformers

    return getattr(transformers, name)


def _auto_config(hf_dir: str):
    """The HF config in `hf_dir` (NEZHA's read by ptm's class: transformers does not know the model type)."""
    import transformers

    with open(os.path.join(hf_dir, "config.json")) as f:
        if json.load(f).get("model_type") == "nezha":
            from checkpoints_tools.nezha.configuration_nezha import NezhaConfig

            return NezhaConfig.from_pretrained(hf_dir)
    return transformers.AutoConfig.from_pretrained(hf_dir)


def _params(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, dict]:
    """meta.json's `params` for whole tensors of a model shaped like `cfg`; which dimension tensor parallelism
    splits comes from megatron-core's attributes on a tiny model of the same structure."""
    import dataclasses

    from pretrain.models.model import Pretraining
    from pretrain.parallel import mcore

    mcore.initialize(1, 0)
    tiny = Pretraining(dataclasses.replace(cfg, vocab_size=8, vocab_pad_to=8, hidden_size=8, num_heads=1,
                                           ffn_hidden_size=8, max_position_embeddings=8))
    dims = {name: info["split_dim"] for name, info in C.param_info(tiny.named_parameters()).items()}
    return {name: {"shape": list(t.shape), "split_dim": dims[name]} for name, t in state.items()}


def _uses_nfkc(hf_dir: str) -> bool:
    path = os.path.join(hf_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        return '"NFKC"' in f.read()
