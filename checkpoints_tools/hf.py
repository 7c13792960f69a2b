"""Hugging Face export and import, both ways: configs, weights and tokenizers. What is particular to a family (its
HF class, key maps, config translation, what the class computes) is its adapter (pretrain/families/); this module
runs any adapter."""
from __future__ import annotations

import contextlib
import json
import os

import torch

from checkpoints_tools.reshard import fresh
from pretrain import checkpoint as C
from pretrain import families
from pretrain.families.base import hf_special_tokens, sentencepiece_to_fast, with_template
from pretrain.models.config import ModelConfig, positions_needed
from ptm.files import copy_file, save_pretrained, whole_dir, write_json


def adapter(arch: str) -> families.Adapter:
    """The Hugging Face adapter of family `arch`."""
    found = families.get(arch).adapter
    if found is None:
        raise C.CheckpointError(f"model.arch={arch} has no Hugging Face class; keep the model in ptm's format")
    return found


def hf_config(cfg: ModelConfig, special: dict):
    """The transformers config of the first model `cfg` exports (`special`: the tokenizer's special ids)."""
    return adapter(cfg.arch).for_model(cfg).hf_config(cfg, special)


# ---- tokenizers -------------------------------------------------------------------------------------

TEMPLATES = ("bert", "roberta", "none")  # the special-token templates an adapter's `tokenizer` names


def export_tokenizer(tok_dir: str, out: str, template: str, nfkc: bool, max_length: int, own=None,
                     ends: tuple = (None, None), tokenizer_class: str = "", stand_ins: dict | None = None) -> None:
    """The dataset's tokenizer as a Hugging Face fast tokenizer (tokenizer.json + tokenizer_config.json) with the
    family's special-token `template` (bert: [CLS] A [SEP] B [SEP]; roberta: <s> A </s></s> B </s>; none: GPT's),
    or for a sentencepiece model, GPT's char_bpe or a tokenizer.json the family's own where it has one
    (`own(pipeline, meta)`, the adapter's `own_tokenizer`: T5's sentinels, XLNet's left padding); `ends`: the ids of
    the model's bos and eos tokens (its HF config's), which such a tokenizer names; `stand_ins` (the adapter's): a
    role without a piece named by another role's (GPT-2's unk: its end of text). A tokenizer of transformers' generic
    class (a template's or a family's own) is named as the family's `tokenizer_class` where that class loads it as
    saved (`named`). The original files are copied too (a tokenizer.json as data_prep.tokenizer.PIPELINE), so
    `from-hf` brings the same tokenizer back."""
    import transformers
    from tokenizers import AddedToken, normalizers

    from data_prep.tokenizer import hf_normalizers, load_tokenizer

    if template not in TEMPLATES:
        raise ValueError(f"tokenizer template {template!r} is not one of {' | '.join(TEMPLATES)}")
    with open(os.path.join(tok_dir, "ptm_tokenizer.json")) as f:
        meta = json.load(f)
    files = [os.path.join(tok_dir, name) for name in meta["files"]]
    ids = meta["special_ids"]  # (the roles a family names by another's piece join them: `stand_ins`)
    meta["special_ids"] = {**ids, **{role: ids.get(other) for role, other in (stand_ins or {}).items()
                                     if ids.get(role) is None}}

    def pipeline():  # a sentencepiece model's, or the very one data_prep encoded with (char_bpe, tokenizer_json)
        return sentencepiece_to_fast(files[0]) if meta["kind"] == "sentencepiece" else load_tokenizer(tok_dir).backend()
    if meta["kind"] == "wordpiece":
        hf = transformers.BertTokenizerFast.from_pretrained(tok_dir, do_lower_case=meta["lowercase"])
    elif meta["kind"] == "bpe" and template == "roberta":  # <s> A </s></s> B </s> around the byte-level BPE; the
        mask = {} if ids.get("mask") is None else {"mask_token": AddedToken(  # mask takes the space before it (as
            _pieces(tok_dir)[ids["mask"]], lstrip=True, normalized=False, special=True)}  # RoBERTa's: what it stands
        hf = transformers.RobertaTokenizerFast.from_pretrained(tok_dir, **mask)  # for is a word with its space)
    elif meta["kind"] == "bpe":  # GPT's ends with the vocabulary's own end of document, not <|endoftext|> added
        piece = _pieces(tok_dir)  # past it (data_prep's has </s>)
        hf = transformers.GPT2TokenizerFast.from_pretrained(
            tok_dir, **hf_special_tokens(meta["special_ids"], piece.__getitem__, "unk", "pad", bos="eod", eos="eod"))
    elif own is not None and (hf := own(pipeline(), meta)) is not None:
        pass
    else:
        inputs = ["input_ids", "attention_mask"] + (["token_type_ids"] if template == "bert" else [])
        tok = with_template(pipeline(), template, meta["special_ids"], files[0])
        ends_of_text = dict(bos="eod", eos="eod") if template == "none" else {}  # (GPT's config names none)
        hf = transformers.PreTrainedTokenizerFast(  # (the model's own pieces: [UNK] or <unk>, ...)
            tokenizer_object=tok, model_input_names=inputs,
            **hf_special_tokens(meta["special_ids"], tok.id_to_token, "unk", "pad", "cls", "sep", "mask",
                                **ends_of_text))
        for name, token_id in zip(("bos_token", "eos_token"), ends):
            if token_id is not None:
                setattr(hf, name, hf.convert_ids_to_tokens(token_id))
    before = ([normalizers.NFKC()] if nfkc else []) + hf_normalizers(meta.get("rewrites", ()))
    if before:  # data_prep normalised the text with NFKC, an imported tokenizer rewrites it: the export does too
        backend = hf.backend_tokenizer
        backend.normalizer = normalizers.Sequence(before + ([backend.normalizer] if backend.normalizer else []))
        if type(hf) is not transformers.PreTrainedTokenizerFast:  # (BERT's, RoBERTa's, GPT-2's class: loading its
            hf = transformers.PreTrainedTokenizerFast(  # files it builds its pipeline from the vocabulary, without
                tokenizer_object=backend, model_input_names=hf.model_input_names,  # these: the generic class keeps
                padding_side=hf.padding_side, **hf.special_tokens_map)  # them, `named` the family's where it can)
    hf.model_max_length = max_length
    hf.save_pretrained(out)
    for path in files:
        copy_file(path, os.path.join(out, os.path.basename(path)))  # (a new file: the umask's mode)
    copy_file(os.path.join(tok_dir, "ptm_tokenizer.json"), os.path.join(out, "ptm_tokenizer.json"))
    if tokenizer_class and type(hf) is transformers.PreTrainedTokenizerFast:
        named(hf, out, tokenizer_class)


PROBES = ["Hello world", " It was the Café, naïve résumé: 这是一个测试。 12345 and 3.14",  # (accents, CJK, digits,
          "tabs\t\tand   spaces  \n"]  # whitespace runs: what `named` encodes with both classes)


def _pieces(tok_dir: str) -> dict[int, str]:
    """A byte-level BPE's pieces by id (its vocab.json)."""
    with open(os.path.join(tok_dir, "vocab.json"), encoding="utf-8") as f:
        return {i: token for token, i in json.load(f).items()}


def named(hf, out: str, name: str) -> None:
    """Name transformers' tokenizer class `name` (a family's) in `out`'s tokenizer_config.json where, loading `out`,
    it is the tokenizer `hf` (transformers' generic class) saved there: the same normalizer, pre-tokenizer, model,
    decoder and added tokens, special tokens, inputs and padding side, and the same encodings of PROBES, alone, as
    pairs and padded (its post-processor: RoBERTa's class builds its own, of the same template). Such a class builds
    its pipeline from the vocabulary alone (BERT's normalizer and pre-tokenizer around a sentencepiece model's pieces,
    without NFKC), so it is named only where it builds this one: else the generic class stays."""
    import transformers

    def built(tok) -> tuple:
        pipeline = json.loads(tok.backend_tokenizer.to_str())
        pipeline.pop("post_processor", None)
        return pipeline, tok.special_tokens_map, len(tok), tok.model_input_names, tok.padding_side

    def encoded(tok) -> list:  # (padded where it has a padding piece; longer than model_max_length, unremarked)
        options = dict(padding=hf.pad_token is not None, return_offsets_mapping=True, return_special_tokens_mask=True,
                       verbose=False)
        return [tok(PROBES, *pair, **options).data for pair in ((), (PROBES[::-1],))]

    cls = getattr(transformers, name)
    try:
        theirs = cls.from_pretrained(out)
    except Exception:  # a class that cannot build its pipeline of these pieces (ALBERT's Unigram of a WordPiece's)
        return
    if built(theirs) == built(hf) and encoded(theirs) == encoded(hf):
        path = os.path.join(out, "tokenizer_config.json")
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        write_json(path, {**config, "tokenizer_class": name})


def import_tokenizer(hf_dir: str, out: str) -> None:
    """A ptm tokenizer directory from a Hugging Face model directory (its ptm_tokenizer.json's, a sentencepiece
    .model, vocab.txt, vocab.json + merges.txt or a tokenizer.json alone, which transformers 5 saves)."""
    from data_prep.tokenizer import META, load_tokenizer

    names = ("vocab.txt", "vocab.json", "tokenizer.json", META)
    if not any(n.endswith(".model") or n in names for n in os.listdir(hf_dir)):
        raise C.CheckpointError(f"{hf_dir} has no tokenizer files ptm can use (a sentencepiece .model, vocab.txt, "
                                "vocab.json + merges.txt or tokenizer.json); copy the original model's tokenizer files "
                                "into it")
    load_tokenizer(hf_dir).save(out)


# ---- checkpoints ------------------------------------------------------------------------------------

def to_hf(ckpt_or_run: str, out: str, max_shard_size: str = "2GB") -> str:
    """Write a transformers model directory (config, safetensors weights, tokenizer) from a ptm checkpoint; a family
    whose export is two models (ELECTRA) writes the second in its subdirectory. A model whose features its family's
    HF class does not compute is refused, one line per feature. The directory is written whole beside `out`, then
    replaces it (`whole_dir`): an earlier export there leaves no file behind (save_pretrained into it would keep a
    model.safetensors beside new shards, or an index naming shards no longer there); a directory that is not a model
    directory is refused."""
    out = out.rstrip("/") or out
    if os.path.isdir(out) and os.listdir(out) and not os.path.isfile(os.path.join(out, "config.json")):
        raise C.CheckpointError(f"{out} holds files but no config.json: not a model directory to replace; pass a new "
                                "or empty directory, or an earlier export")
    ckpt = C.check_complete(C.resolve(ckpt_or_run))
    meta = C.read_meta(ckpt)
    cfg = C.model_config(meta)
    if families.get(cfg.arch).adapter is None:
        raise C.CheckpointError(f"{ckpt} holds model.arch={cfg.arch}, which has no Hugging Face class; "
                                f"{families.get(cfg.arch).export}")
    family = adapter(cfg.arch).for_model(cfg)
    models = family.models(cfg)
    problems = [p for _, m, _ in models for p in family.problems(m)]
    if problems:
        raise C.CheckpointError("\n".join(f"{ckpt}: {p}" for p in problems))
    tok_dir = os.path.join(ckpt, "tokenizer")
    with open(os.path.join(tok_dir, "ptm_tokenizer.json")) as f:
        tok_meta = json.load(f)
    if tok_meta["kind"] == "words":  # (a run of an older ptm: training on words now refuses such an objective)
        raise C.CheckpointError(f"{ckpt} was trained on words (a `data_prep words` dataset), which a Hugging Face "
                                f"{cfg.arch} model does not read; train it on a `data_prep build` dataset")
    try:
        with whole_dir(out) as tmp:
            configs = [family.hf_config(m, tok_meta["special_ids"]) for _, m, _ in models]
            states = family.split(C.load_full_model(ckpt), cfg)
            for (sub, model_cfg, cls), config, weights in zip(models, configs, states):
                where = os.path.join(tmp, sub) if sub else tmp
                _write_hf(family, model_cfg, config, weights, cls, where, meta, ckpt, max_shard_size)
                export_tokenizer(tok_dir, where, family.tokenizer, meta.get("nfkc", False), _longest(cfg),
                                 own=family.own_tokenizer,
                                 ends=(getattr(config, "bos_token_id", None), getattr(config, "eos_token_id", None)),
                                 tokenizer_class=family.tokenizer_class, stand_ins=family.stand_ins)
    except families.ExportError as e:  # a feature its config cannot hold, pieces its tokenizer's template needs
        raise C.CheckpointError(f"{ckpt}: {e}") from None
    return out


def _longest(cfg: ModelConfig) -> int:
    """The most tokens the model takes: its position table's rows past those that sequences start after (RoBERTa's
    padding id, BART's offset)."""
    return cfg.max_position_embeddings - (positions_needed(cfg, 0) if cfg.positional.table else 0)


def _write_hf(family: families.Adapter, cfg: ModelConfig, config, state: dict, cls: str, out: str, meta: dict,
              ckpt: str, max_shard_size: str) -> None:
    """One transformers model `cls` of `config` holding ptm weights `state`, saved to `out` with the files the
    family's class needs."""
    weights = family.to_hf(state, cfg.num_layers, cfg.num_heads, cfg.vocab_size)
    for key, value in meta.get("hf_token_ids", {}).items():  # imported models keep their own special ids
        setattr(config, key, value)
    # transformers builds the model on the meta device and takes these tensors as its weights: no second copy,
    # no random initialisation (a model built first and loaded into held two)
    with quiet_load():
        model, result = family.hf_model_class(cls).from_pretrained(None, config=config, state_dict=weights,
                                                                    dtype=torch.float32, output_loading_info=True)
    missing, unexpected = sorted(result["missing_keys"]), sorted(result["unexpected_keys"])
    if missing or unexpected or result["mismatched_keys"]:
        raise C.CheckpointError(f"{ckpt} does not fit {cls}: missing {missing[:5]}, unexpected {unexpected[:5]}, "
                                f"other shapes {sorted(result['mismatched_keys'])[:5]}")
    save_pretrained(model, out, max_shard_size=max_shard_size)
    for path in family.files():  # e.g. a modeling file that config.json's auto_map names
        copy_file(path, os.path.join(out, os.path.basename(path)))


@contextlib.contextmanager
def quiet_load():
    """No progress bar or load report of transformers' own while it loads weights ptm checks itself."""
    from transformers.utils import logging

    bars, level = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def from_hf(hf_dir: str, out: str) -> tuple[str, list[str]]:
    """A ptm checkpoint (step 0) from a transformers directory; returns it and the heads that HF did not
    have and were initialised (base models such as BertModel or GPT2Model)."""
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        what = "has no config.json" if os.path.isdir(hf_dir) else "is not a directory"
        raise C.CheckpointError(f"{hf_dir} {what}: not a Hugging Face model directory; pass the directory that "
                                "save_pretrained wrote (config.json, weights, tokenizer files)")
    family, hf_cfg = read_config(hf_dir)
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
    if not any(os.path.isfile(os.path.join(hf_dir, w)) for w in weights):
        raise C.CheckpointError(f"{hf_dir} has config.json but no weights ({' or '.join(weights[::2])}); pass the "
                                "whole directory that save_pretrained wrote")
    try:
        cfg = ModelConfig(**family.read_model_config(hf_dir, hf_cfg, read_config))
    except families.ExportError as e:
        raise C.CheckpointError(str(e)) from None
    with fresh(out) as tmp:
        state, initialised = import_weights(family, cfg, hf_dir, hf_cfg)
        C.save_model(tmp, state)
        import_tokenizer(hf_dir, os.path.join(tmp, "tokenizer"))
        token_ids = {k: getattr(hf_cfg, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                     if getattr(hf_cfg, k, None) is not None}
        C.write_meta(tmp, model=cfg, params=_params(cfg, state),
                     extra={"source": os.path.abspath(hf_dir), "initialised": initialised,
                            "nfkc": _uses_nfkc(hf_dir), "hf_token_ids": token_ids})
    return out, initialised


def read_config(hf_dir: str):
    """(the family adapter, the transformers config) of a Hugging Face directory (a family with its own config class,
    as NEZHA's, reads it with that class: transformers does not know the model type)."""
    import transformers

    path = os.path.join(hf_dir, "config.json")
    try:
        with open(path) as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError) as e:  # not JSON, not text, or not an object
        raise C.CheckpointError(f"{path} is not a readable config ({str(e).splitlines()[0] or type(e).__name__}); "
                                "save the model again (save_pretrained) or download it again") from None
    family = families.by_model_type(model_type)
    if family is None:
        known = ", ".join(f.adapter.model_type for f in families.REGISTRY.values() if f.adapter)
        raise C.CheckpointError(f"model type {model_type!r} is not supported; ptm imports {known}")
    config_class = family.adapter.hf_config_class()
    hf_cfg = (config_class or transformers.AutoConfig).from_pretrained(hf_dir)
    return family.adapter, hf_cfg


def import_weights(family: families.Adapter, cfg: ModelConfig, hf_dir: str, hf_cfg) -> tuple[dict, list[str]]:
    """The ptm state dict of the model(s) in `hf_dir`, and what the directory lacked (initialised)."""
    (sub, _, _), *companions = family.models(cfg)
    state, initialised = _import_weights(family, cfg, hf_dir, family.import_class(hf_cfg))
    for sub, model_cfg, cls in companions:  # ELECTRA's generator, from its subdirectory, else new
        where = os.path.join(hf_dir, sub)
        if os.path.isfile(os.path.join(where, "config.json")):
            theirs, missing = _import_weights(family, model_cfg, where, cls)
        else:
            theirs, missing = _new_model(model_cfg, family.shared), None
        state, added = family.join(state, theirs, sub)
        initialised += added if missing is None else missing
    return state, initialised


def _new_model(cfg: ModelConfig, shared: tuple[str, ...]) -> dict:
    """A freshly initialised model's own parameters (those in `shared` are another model's), for a directory that
    holds only the first of a family's models."""
    from pretrain import models
    from pretrain.parallel import mcore

    torch.manual_seed(0)
    return {k: p.detach() for k, p in models.build(cfg, tp=mcore.OneRank()).named_parameters() if k not in shared}


def _import_weights(family: families.Adapter, cfg: ModelConfig, hf_dir: str, cls: str) -> tuple[dict, list[str]]:
    """The ptm state dict of the HF model `cls` in `hf_dir`, and what HF lacked (initialised)."""
    torch.manual_seed(0)
    try:
        model, info = family.hf_model_class(cls).from_pretrained(hf_dir, output_loading_info=True)
    except Exception as e:  # safetensors', torch's or transformers' own reasons a file does not load
        raise C.CheckpointError(f"{hf_dir}: transformers cannot load the weights ({str(e).splitlines()[0]}); the files "
                                "are damaged or incomplete: save the model again or download it again") from None
    state, missing = family.from_hf(model.state_dict(), cfg.num_layers, cfg.num_heads, cfg.vocab_size,
                                    task_types=cfg.task_type_vocab_size > 0)
    ours = set(_param_names(cfg))  # a key map may name parameters this model does not have (another head)
    missing = [k for k in missing if k in ours]
    return state, sorted(k for k in info["missing_keys"] if not k.endswith("position_ids")) + missing


def _param_names(cfg: ModelConfig) -> list[str]:
    """The parameter names of a ptm model shaped like `cfg` (a tiny one of the same structure is built)."""
    return list(_tiny(cfg).state_dict())


def _tiny(cfg: ModelConfig):
    import dataclasses

    from pretrain import models
    from pretrain.parallel import mcore

    embedding = 0 if cfg.embedding_size in (0, cfg.hidden_size) else 4  # a projection where the model has one
    return models.build(dataclasses.replace(cfg, vocab_size=8, vocab_pad_to=8, hidden_size=8, num_heads=1,
                                            ffn_hidden_size=8, max_position_embeddings=8, embedding_size=embedding),
                        tp=mcore.OneRank())


def _params(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, dict]:
    """meta.json's `params` for whole tensors of a model shaped like `cfg`; which dimension tensor parallelism
    splits comes from megatron-core's attributes on a tiny model of the same structure."""
    dims = {name: info["split_dim"] for name, info in C.param_info(_tiny(cfg).named_parameters()).items()}
    return {name: {"shape": list(t.shape), "split_dim": dims[name]} for name, t in state.items()}


def _uses_nfkc(hf_dir: str) -> bool:
    path = os.path.join(hf_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        return '"NFKC"' in f.read()
