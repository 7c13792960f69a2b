"""A model family: the features its preset's model computes, a config rule it may own, its model class, its cost
hooks and its Hugging Face adapter.

An `Adapter` is the conversion of one family as data (the HF class, key maps, the QKV layout, tied names, what the
HF class computes) plus a few hooks (config translation both ways). checkpoints_tools/hf.py runs it; nothing here
imports torch or transformers until a conversion calls it.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable

VOCAB_ROWS = ("embeddings.word.weight", "mlm.bias")  # the shared model's parameters with a row per (padded)
# vocabulary entry; a family's own add to them (`Family.vocab_rows`; every family's: `families.VOCAB_ROWS`)
ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new"}  # ptm -> HF hidden_act
COMMON = dict(norm_type="layernorm", bias=True, gated_mlp=False, scaled_attention=True, scaled_logits=False,
              init="normal", relative_segments=False, attention_layers=["global"], qkv_bias=True)
# the model features of a family that does not name them (every family before T5), and what its HF class computes


class ExportError(ValueError):
    """A model the adapter's Hugging Face class cannot hold; the message names the feature and the fix."""


class Cost:
    """A family's cost hooks, torch-free: pretrain/cost.py counts every model with the transformer's formulas and asks
    these where its family's model differs (`ptm plan`, the speed model and the MFU count with them)."""

    def stacks(self, m, seq_len: int, decoder: int, predicted: int) -> list | None:
        """The model's own stacks of layers (pretrain/stacks.py's `Stack`) on sequences of `seq_len`, with `decoder`
        tokens for a decoder (0: seq_len) and `predicted` tokens predicted; None: one stack of m.num_layers."""
        return None

    def companions(self, m) -> list:
        """Models trained beside this one that read its embeddings (ELECTRA's generator), counted with it."""
        return []

    def layer_modules(self, m, layer: dict) -> dict:
        """The parameters of one block: `layer` is the transformer's ({"norms", "attention", "mlp"}: lists of
        (TP-split, replicated) counts); a family whose blocks differ returns its own."""
        return layer

    def more_modules(self, m, layer: dict, shared: dict) -> list:
        """Parameters the model has beyond the transformer's embeddings, blocks and heads, as (TP-split, replicated)
        counts; `shared`: the transformer's counts a family's may repeat ("norm": one norm, "positions": the position
        table, "embedding_norm": the embeddings' LayerNorm or 0, "vocab": the padded vocabulary)."""
        return []

    def modules(self, m) -> list | None:
        """Every parameter of a model that is no transformer (ELMo's LSTMs), as (TP-split, replicated) counts."""
        return None

    def flops(self, m, seq_len: int) -> float | None:
        """Training FLOPs of one sequence of such a model (see `modules`)."""
        return None

    def activation_bytes(self, cfg, micro_batch: int) -> tuple[int, int] | None:
        """(layers, output) activation bytes per GPU of such a model (see `modules`)."""
        return None

    def launches(self, m, seq_len: int) -> tuple[int, int, int] | None:
        """Kernel launches of a step of such a model (see `modules`) at TP=1: (first micro-batch, each further one,
        the step's end), as pretrain/cost.py's `Launches`; None: counted as transformer layers."""
        return None

    def carried_bytes(self, cfg, dp: int) -> int:
        """Memory per GPU the model carries from one step to the next (a recurrent model's memory of its streams)."""
        return 0


@dataclass(frozen=True)
class Format:
    """A family's file format other than Hugging Face's (ELMo's bilm-tf files), converted by `ptm convert to-NAME` and
    `from-NAME`: `module` (imported when converting) holds `to_NAME(checkpoint, out) -> directory written` and
    `from_NAME(directory, out) -> (checkpoint written, parameters it initialised)`."""

    name: str  # the verbs' suffix
    module: str  # "package.module" of the two functions
    files: str  # what the export writes and the import reads
    writes: str  # the export's --help description
    reads: str  # the import's --help description
    source: str  # the import's argument


@dataclass(frozen=True)
class Command:
    """A command a family adds to `ptm` (`python -m pretrain NAME`): its help and description, its arguments as
    argparse's (flags, options) pairs, and `run`, "module:function" of the parsed arguments returning the text to
    print (imported when it runs, so the parsers stay torch-free)."""

    name: str
    help: str
    description: str
    arguments: tuple
    run: str


@dataclass(frozen=True)
class Family:
    name: str
    help: str
    features: dict  # the model features of its presets (pretrain/models/config.py): the arch's defaults
    adapter: "Adapter | None" = None
    check: Callable | None = None  # check(cfg, need, objective): a config rule this family owns, run for every config
    model: str = "pretrain.models.model:Pretraining"  # its model class, "module:Class" (imported when built)
    cost: Cost = Cost()  # where its model costs what the transformer's formulas do not count
    attends: bool = True  # its model is blocks of attention heads (ELMo's is a character CNN and LSTMs)
    section: tuple = ()  # the model.* fields only it reads, (name, type, schema.opt(...)) each: its config section,
    # joined into ModelConfig (pretrain/models/config.py); tests/test_imports.py guards their reads
    vocab_rows: tuple = ()  # its model's own parameters with a row per (padded) vocabulary entry (XLNet's LM bias)
    commands: tuple = ()  # the `Command`s it adds to `ptm` (ELMo's `ptm elmo`)
    formats: tuple = ()  # its `Format`s other than Hugging Face's (converted by the convert verbs they name)
    wire: Callable | None = None  # wire(model): what its model builds beyond the features' layers (ELECTRA's
    # generator), called by the model once its own layers are initialised
    export: str = "keep the model in ptm's format"  # what to do with a model that has no HF class (no adapter)
    idle: Callable | None = None  # idle(model_cfg): names of its model's modules or parameters that config never
    # trains (Transformer-XL's XLNet-only ones, kept for the export): left as they are, as `Objective.idle`'s


    @property
    def fields(self) -> tuple[str, ...]:
        """The names of its section's fields."""
        return tuple(name for name, *_ in self.section)


class Adapter:
    """Hugging Face <-> ptm weights and configs for one family. Subclasses set the data and override hooks."""

    hf_class = ""  # the transformers class export writes (by name)
    model_type = ""  # the HF config.model_type import reads
    prefix = ""  # the HF name prefix of the base model, e.g. "bert."
    layer = "{p}encoder.layer.{i}."  # the HF prefix of layer i ({p}: prefix)
    qkv = "attention.self"  # within a layer: separate query/key/value linears under this name
    qkv_names = ("query", "key", "value")  # their names under it
    fused_qkv = False  # one fused [q; k; v] linear named `qkv` instead (GPT-2's c_attn)
    conv1d = False  # attention and MLP weights stored [in, out] (OpenAI's Conv1D)
    layer_keys: dict = {}  # ptm block parameter -> HF name within the layer
    keys: dict = {}  # ptm parameter outside the layers -> HF name ({p}: prefix)
    tied: dict = {}  # HF names that hold another HF name's tensor (tied output projections)
    computes: dict = {}  # model feature -> the values the HF class computes; export refuses others
    tokenizer = "bert"  # special-token template of the exported tokenizer: bert | roberta | none (GPT's)
    # (checkpoints_tools/hf.py: TEMPLATES, export_tokenizer), unless `own_tokenizer` gives the family's own
    tokenizer_class = ""  # transformers' tokenizer class of the family (BertTokenizer ...): the exported
    # tokenizer_config.json names it where it loads the tokenizer as exported (checkpoints_tools/hf.py: `named`)
    stand_ins: dict = {}  # special role -> the role whose piece the exported tokenizer names for it where the
    # vocabulary has no piece of its own (GPT-2's unk: its end of text, as transformers' GPT-2 tokenizer files)
    head_widths = False  # the HF class takes heads of any width (T5's d_kv), not only hidden_size / num_heads
    causal = False  # the HF class is a left-to-right language model (downstream: perplexity, last-word accuracy)

    # ---- configs ------------------------------------------------------------------------------------------

    def hf_config(self, cfg, special: dict):
        """The transformers config of ptm ModelConfig `cfg` (`special`: the tokenizer's special ids)."""
        raise NotImplementedError

    def model_config(self, hf) -> dict:
        """The ptm ModelConfig fields of a transformers config (arch included)."""
        raise NotImplementedError

    def problems(self, cfg) -> list[str]:
        """Why `cfg`'s model is not what the HF class computes (empty: it is): one line per feature, with the fix."""
        out = []
        common = {k: tuple(v) if isinstance(v, list) else (v,)  # (a list: the values each element may take)
                  for k, v in COMMON.items() if k != "init"}  # (init: how weights start, nothing HF computes)
        for key, allowed in {**common, **self.computes}.items():
            value = getattr(cfg, key)
            ok = value in allowed if not isinstance(value, list) else all(v in allowed for v in value)
            if not ok:
                shown = value if not isinstance(value, list) else f"[{', '.join(value)}]"
                out.append(f"model.{key}={shown} has no HF class: {self.hf_class} computes {key} = "
                           f"{' | '.join(map(str, allowed))}; keep the model in ptm's format, or train one with a "
                           f"model.{key} that {self.hf_class} computes")
        if cfg.attention_width != cfg.hidden_size and not self.head_widths:
            out.append(f"model.head_dim={cfg.head_dim} has no HF class: {self.hf_class} splits hidden_size over the "
                       f"heads; keep the model in ptm's format, or train one with model.head_dim=0")
        return out

    def for_model(self, cfg) -> "Adapter":
        """The adapter that exports a model shaped like `cfg`: this one, or for a family whose models have more than
        one HF class, the one that computes this model (GPT-3's: dense or alternating)."""
        return self

    shared: tuple[str, ...] = ()  # a companion model's parameters that are the first model's (ELECTRA's embeddings)

    def models(self, cfg) -> list[tuple[str, object, str]]:
        """(subdirectory, ptm ModelConfig, HF class) of each model the export writes: one, in the directory."""
        return [("", cfg, self.hf_class)]

    def split(self, state: dict, cfg) -> list[dict]:
        """The ptm state dict of each of `models(cfg)`."""
        return [state]

    def join(self, state: dict, companion: dict, subdirectory: str) -> tuple[dict, list[str]]:
        """Inverse of `split` for one companion model (the second of `models`): the joined state, and the names its
        parameters take in it."""
        raise NotImplementedError

    def read_model_config(self, hf_dir: str, hf, read) -> dict:
        """The ptm ModelConfig fields of the Hugging Face directory `hf_dir` whose config is `hf`; `read(dir)` reads
        another directory's (adapter, config), e.g. a companion model's. A config without the longest input (T5's,
        XLNet's: no position table) leaves it to the tokenizer, whose model_max_length the export writes from
        model.max_position_embeddings."""
        fields = self.model_config(hf)
        return fields if "max_position_embeddings" in fields else {**fields, "max_position_embeddings": longest(hf_dir)}

    def import_class(self, hf) -> str:
        """The transformers class that loads a directory of this family (a base model gets its heads initialised)."""
        return self.hf_class

    def files(self) -> list[str]:
        """Files that travel with the exported weights (a modeling file for `trust_remote_code`)."""
        return []

    def hf_model_class(self, name: str):
        """A transformers model class by name."""
        import transformers

        return getattr(transformers, name)

    def own_tokenizer(self, tok, meta: dict):
        """The family's own Hugging Face tokenizer around `tok` (a `tokenizers.Tokenizer`: a sentencepiece model's, a
        tokenizer.json's; `meta`: data_prep's ptm_tokenizer.json), or None: the `tokenizer` template's."""
        return None

    def hf_config_class(self):
        """The config class that reads this family's config.json (None: transformers' AutoConfig)."""
        return None

    # ---- weights ------------------------------------------------------------------------------------------

    def blocks(self, num_layers: int) -> int:
        """ptm blocks that hold parameters (ALBERT's layers share one)."""
        return num_layers

    def key_map(self, num_layers: int, task_types: bool = False) -> dict[str, str]:
        """Every ptm parameter name (but the fused QKV) -> its HF name; `task_types`: ERNIE's use_task_id."""
        m = {k: v.format(p=self.prefix) for k, v in self.keys.items()
             if task_types or k != "embeddings.task_type.weight"}
        for i in range(self.blocks(num_layers)):
            at = self.layer.format(p=self.prefix, i=i)
            m.update({f"blocks.{i}.{k}": at + v for k, v in self.layer_keys.items()})
        return m

    def _transposed(self, ptm_key: str) -> bool:
        return self.conv1d and ptm_key.endswith("weight") and (".attn." in ptm_key or ".mlp." in ptm_key)

    def from_hf(self, hf: dict, num_layers: int, num_heads: int, vocab_rows: int,
                task_types: bool = False) -> tuple[dict, list[str]]:
        """HF state dict -> ptm state dict (vocabulary rows padded to `vocab_rows`); also the ptm keys HF did not
        have (heads to initialise)."""
        import torch

        out, missing = {}, []
        for ours, theirs in self.key_map(num_layers, task_types).items():
            if theirs not in hf:
                missing.append(ours)
                continue
            t = hf[theirs].t() if self._transposed(ours) else hf[theirs]
            if ours in VOCAB_ROWS and t.shape[0] < vocab_rows:
                t = torch.cat([t, t.new_zeros(vocab_rows - t.shape[0], *t.shape[1:])])
            out[ours] = t.contiguous()
        for i in range(self.blocks(num_layers)):
            at = self.layer.format(p=self.prefix, i=i) + self.qkv
            for kind in ("weight", "bias"):
                if f"{at}.{kind}" not in hf and f"{at}.{self.qkv_names[0]}.{kind}" not in hf:
                    continue  # no biases (model.qkv_bias=false)
                if self.fused_qkv:
                    fused = hf[f"{at}.{kind}"]
                    q, k, v = (fused.t() if kind == "weight" and self.conv1d else fused).chunk(3, dim=0)
                else:
                    q, k, v = (hf[f"{at}.{name}.{kind}"] for name in self.qkv_names)
                out[f"blocks.{i}.attn.qkv.{kind}"] = interleave_heads((q, k, v), num_heads).contiguous()
        return out, missing

    def to_hf(self, ours: dict, num_layers: int, num_heads: int, vocab_size: int) -> dict:
        """ptm state dict -> HF state dict (padding rows dropped; tied copies included)."""
        import torch

        out = {}
        for mine, theirs in self.key_map(num_layers, "embeddings.task_type.weight" in ours).items():
            if mine not in ours:
                continue
            t = ours[mine][:vocab_size] if mine in VOCAB_ROWS else ours[mine]
            out[theirs] = (t.t() if self._transposed(mine) else t).contiguous()
        for i in range(self.blocks(num_layers)):
            at = self.layer.format(p=self.prefix, i=i) + self.qkv
            for kind in ("weight", "bias"):
                if f"blocks.{i}.attn.qkv.{kind}" not in ours:
                    continue  # no biases (model.qkv_bias=false)
                q, k, v = split_heads(ours[f"blocks.{i}.attn.qkv.{kind}"], num_heads)
                if self.fused_qkv:
                    fused = torch.cat([q, k, v])
                    out[f"{at}.{kind}"] = (fused.t() if kind == "weight" and self.conv1d else fused).contiguous()
                else:
                    for name, t in zip(self.qkv_names, (q, k, v)):
                        out[f"{at}.{name}.{kind}"] = t.contiguous()
        for copy, source in self.tied.items():
            if source in out:
                out[copy] = out[source]
        return out


def take(hf: dict, key_map: dict, vocab_rows: int, rows: tuple = VOCAB_ROWS) -> tuple[dict, list[str]]:
    """The ptm tensors of `key_map` (ptm name -> HF name) from HF state dict `hf`, vocabulary rows (of the parameters
    `rows` names) padded to `vocab_rows`; and the ptm names `hf` lacks."""
    import torch

    out, missing = {}, []
    for ours, theirs in key_map.items():
        if theirs not in hf:
            missing.append(ours)
            continue
        t = hf[theirs]
        if ours in rows and t.shape[0] < vocab_rows:
            t = torch.cat([t, t.new_zeros(vocab_rows - t.shape[0], *t.shape[1:])])
        out[ours] = t.contiguous()
    return out, missing


def interleave_heads(parts, heads: int):
    """[q; k; v] or [k; v] (each [hidden, ...]) -> Megatron's per-head layout [heads][len(parts)][head_dim, ...] of a
    fused QKV (or cross-attention KV) linear."""
    import torch

    stacked = torch.stack(list(parts))  # [n, hidden, ...]
    rest = stacked.shape[2:]
    return stacked.view(len(parts), heads, -1, *rest).transpose(0, 1).reshape(-1, *rest)


def split_heads(fused, heads: int, parts: int = 3):
    """Inverse of interleave_heads: -> `parts` tensors (q, k, v; or k, v)."""
    rest = fused.shape[1:]
    return fused.view(heads, parts, -1, *rest).transpose(0, 1).reshape(parts, -1, *rest).unbind(0)


def hf_common(cfg, special: dict, cls: str) -> dict:
    """The BERT-style transformers config fields of ptm ModelConfig `cfg`."""
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                num_attention_heads=cfg.num_heads, intermediate_size=cfg.ffn_hidden_size,
                hidden_act=ACTIVATIONS[cfg.activation], hidden_dropout_prob=cfg.hidden_dropout,
                attention_probs_dropout_prob=cfg.attention_dropout,
                max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=cfg.type_vocab_size,
                layer_norm_eps=cfg.layer_norm_eps, initializer_range=cfg.init_std,
                pad_token_id=special.get("pad", 0), architectures=[cls])


def model_common(hf, arch: str) -> dict:
    """The ptm ModelConfig fields of a BERT-style transformers config."""
    activation = {v: k for k, v in ACTIVATIONS.items()}.get(hf.hidden_act)
    if activation is None:
        raise ExportError(f"hidden_act={hf.hidden_act!r} is not one ptm has ({', '.join(ACTIVATIONS.values())})")
    return dict(arch=arch, activation=activation, vocab_size=hf.vocab_size, vocab_pad_to=1, hidden_size=hf.hidden_size,
                num_layers=hf.num_hidden_layers, num_heads=hf.num_attention_heads, ffn_hidden_size=hf.intermediate_size,
                max_position_embeddings=hf.max_position_embeddings, type_vocab_size=hf.type_vocab_size,
                task_type_vocab_size=0, layer_norm_eps=hf.layer_norm_eps, hidden_dropout=hf.hidden_dropout_prob,
                attention_dropout=hf.attention_probs_dropout_prob, init_std=hf.initializer_range)


def longest(hf_dir: str) -> int:
    """The most tokens the Hugging Face tokenizer in `hf_dir` gives its model: its tokenizer_config.json's
    model_max_length, else what transformers reads without one (no limit: its VERY_LARGE_INTEGER)."""
    from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

    try:
        with open(os.path.join(hf_dir, "tokenizer_config.json"), encoding="utf-8") as f:
            found = json.load(f).get("model_max_length")
    except (OSError, ValueError, AttributeError):  # none, not JSON, not an object
        found = None
    return found if type(found) is int and found > 0 else VERY_LARGE_INTEGER


def hf_special_tokens(ids: dict, piece, *roles: str, null: bool = False, **renamed: str) -> dict:
    """A Hugging Face tokenizer's `<name>_token` arguments: the piece (`piece(id)`) of each of `roles` in special ids
    `ids` (data_prep's), and of `renamed`'s (name=role: GPT's bos="eod"); a role without an id is left out, or with
    `null` is None (saved as null: a tokenizer class loading it does not add its own, XLNet's <pad>)."""
    names = {**{r: r for r in roles}, **renamed}
    return {f"{name}_token": None if ids.get(role) is None else piece(ids[role]) for name, role in names.items()
            if null or ids.get(role) is not None}


def sentencepiece_to_fast(model_file: str):
    """A `tokenizers.Tokenizer` of a sentencepiece model: transformers' own converter (ids identical to
    sentencepiece's), with byte fallback decoding."""
    from tokenizers import decoders
    from transformers.convert_slow_tokenizer import SpmConverter

    class Converter(SpmConverter):
        handle_byte_fallback = True

    class Source:
        vocab_file = model_file
        legacy = True

    tok = Converter(Source()).converted()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1)])
    return tok


def with_offsets_kept(tok, template):
    """`tok`'s post-processor `template` (a `tokenizers` processor placing the special tokens, or None) after the
    trimming of a byte-level BPE's offsets that its tokenizer.json did (RoBERTa's, BART's: a token's offsets without
    its leading space; GPT-2's trims none)."""
    from tokenizers import processors

    found = json.loads(tok.to_str()).get("post_processor") or {}
    trim = next((p for p in found.get("processors", [found])
                 if p.get("type") in ("ByteLevel", "RobertaProcessing") and p.get("trim_offsets")), None)
    if trim is None:
        return template
    trim = processors.ByteLevel(add_prefix_space=trim.get("add_prefix_space", False), trim_offsets=True,
                                use_regex=trim.get("use_regex", True))
    return trim if template is None else processors.Sequence([trim, template])


def with_template(tok, template: str, special: dict, source: str):
    """`tok` (a `tokenizers.Tokenizer` of the tokenizer file `source`) with, for bidirectional models, BERT's cls A
    sep B sep template (RoBERTa's cls A sep sep B sep, one segment type) of its own cls and sep pieces (`special`:
    data_prep's special ids: [CLS] or <s>, ...), and none for GPT's ("none"); offsets as its file had them
    (`with_offsets_kept`)."""
    from tokenizers import processors

    placed = None
    if template != "none":
        missing = [f"{role} piece ({names})" for role, names in (("cls", "[CLS], <cls> or <s>"),
                                                                  ("sep", "[SEP], <sep> or </s>"))
                   if special.get(role) is None]
        if missing:
            raise ExportError(f"the tokenizer {source} has no {' and no '.join(missing)}, which the {template} "
                              "template puts around each sequence; keep the model in ptm's format, or train it on a "
                              "tokenizer with both")
        cls, sep = tok.id_to_token(special["cls"]), tok.id_to_token(special["sep"])
        pair = f"{cls} $A {sep} {sep} $B {sep}" if template == "roberta" else f"{cls} $A {sep} $B:1 {sep}:1"
        placed = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=pair, special_tokens=[(cls, special["cls"]), (sep, special["sep"])])
    tok.post_processor = with_offsets_kept(tok, placed)
    return tok
