"""The training config: nested dataclasses loaded from YAML with dotted overrides, validated before training.

    cfg = load("configs/bert-base.yaml", ["train.steps=1000", "optimizer.name=lamb"])
    cfg.validate(dp=world_size // cfg.parallel.tp)
    text = cfg.to_yaml()                      # the resolved config (checkpoints keep it)

A YAML file may start from another one with `base: other.yaml` (relative to the file; a bare name such as
`bert-base` is a preset from configs/) and override some keys: mappings merge key by key, lists and scalars
replace. Unknown keys are errors, and values are coerced to the field's type.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import types
import typing
from dataclasses import dataclass, field

import yaml

from pretrain import objectives
from pretrain.models.config import (ACTIVATIONS, ARCHS, HEADS, NORMS, POSITIONS, SHARING, ModelConfig, embedding_width,
                                    generator_config, positions_needed)
from pretrain.objectives.ernie import TASK_SPECS, USER_LABELED
from pretrain.objectives.masking import KNOWLEDGE_LEVELS as _KNOWLEDGE_UNITS, STRATEGIES as MASKINGS
from ptm import shipped


PRESETS_DIR = shipped("presets", "configs")
PRECISIONS = ("fp32", "bf16", "fp16")
GRAD_ACCUM_DTYPES = ("fp32", "bf16")
OPTIMIZERS = ("adamw", "lamb")
SCHEDULES = ("linear", "poly", "cosine", "constant")
OBJECTIVES = {name: o.help for name, o in objectives.REGISTRY.items()}
ERNIE_TASKS = {name: task.help for name, task in TASK_SPECS.items()}
KNOWLEDGE_LEVELS = tuple(_KNOWLEDGE_UNITS)

# help for the `model` section, whose dataclass lives with the model (pretrain/models/config.py)
MODEL_HELP = {
    "arch": " | ".join(ARCHS) + ": a preset of the features below (unset ones take the arch's) and the Hugging "
            "Face class for conversion",
    "vocab_size": "vocabulary size; 0: the dataset's tokenizer",
    "vocab_pad_to": "embedding rows are padded to a multiple of this (must be divisible by parallel.tp)",
    "hidden_size": "width of the hidden states",
    "embedding_size": "width of the embeddings, projected to hidden_size (ALBERT's factorised embedding); the MLM head "
                      "maps back to it; 0: hidden_size",
    "num_layers": "transformer layers",
    "num_heads": "attention heads",
    "ffn_hidden_size": "inner width of the MLP",
    "max_position_embeddings": "learned positions: the longest data.seq_len the model takes",
    "type_vocab_size": "segment embeddings (BERT, ERNIE); 0 for GPT-2",
    "task_type_vocab_size": "ERNIE 2.0 task-type embeddings (HF use_task_id); 0: none",
    "layer_norm_eps": "LayerNorm epsilon",
    "hidden_dropout": "dropout on embeddings and sublayer outputs",
    "attention_dropout": "dropout on attention probabilities",
    "init_std": "standard deviation of the normal weight initialisation",
    "activation_checkpointing": "recompute activations in the backward pass: true (every layer) or layer indices",
    "norm": "post: LayerNorm after each residual sum and on the embeddings (BERT); pre: before each sublayer, and a "
            "final one (GPT-2); null: the arch's",
    "activation": " | ".join(ACTIVATIONS) + ": the MLP's activation; null: the arch's",
    "causal": "attend to earlier tokens only (GPT-2); null: the arch's",
    "heads": "output heads: lm (word embeddings as output projection), mlm (BERT's transform first), rtd (ELECTRA's "
             "replaced-token detection, with a generator), nsp (pooler + 2-way classifier for NSP/SOP); null: the arch's",
    "generator_size": "ELECTRA (heads [rtd]): the generator's width (hidden size, heads, MLP) as a fraction of the "
                      "model's; it shares the model's embeddings (the paper: 1/4 to 1/2)",
    "scaled_init": "initialise residual output projections with init_std / sqrt(2 * num_layers) (GPT-2); null: the "
                   "arch's",
    "position_encoding": "learned (absolute positions from 0) | roberta (from pad_token_id + 1, padding tokens at "
                         "pad_token_id, as HF RoBERTa) | relative (NEZHA's functional relative positions: fixed "
                         "sinusoids of the clipped distance added to keys and values inside attention, no position "
                         "table); null: the arch's",
    "max_relative_position": "position_encoding=relative: attention tells distances apart up to this many tokens "
                             "(NEZHA: 64)",
    "pad_token_id": "the padding id, which position_encoding=roberta numbers positions from; -1: the dataset's",
    "share_layers": "none | all (one layer's parameters for every layer, ALBERT) | attention | ffn (only those "
                    "sublayers shared); null: the arch's",
}


class ConfigError(ValueError):
    """A bad config file, override or value; the message names the key and the fix."""


def _opt(default, help_: str):
    """A field with its one-line description; list and dict defaults are copied per instance."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: json.loads(json.dumps(default)), metadata={"help": help_})
    return field(default=default, metadata={"help": help_})


@dataclass
class DataConfig:
    path: str | list[str] = _opt("", "dataset directory built by `ptm prep`, or a list of them to blend")
    weights: list[float] | None = _opt(None, "sampling weight of each data.path (default: by size)")
    seq_len: int = _opt(512, "tokens per training sequence")
    objective: str = _opt("mlm_nsp", " | ".join(OBJECTIVES))
    mask_prob: float = _opt(0.15, "fraction of tokens masked (masked-LM objectives)")
    max_predictions_per_seq: int = _opt(0, "most masked tokens per sequence; 0: ceil(mask_prob * seq_len)")
    masking: str = _opt("token", " | ".join(MASKINGS))
    short_seq_prob: float = _opt(0.1, "probability of a shorter sequence (BERT's short_seq_prob)")
    similar_words: str = _opt("", "data.masking=correction (MacBERT): a UTF-8 file, one word per line followed by its "
                                  "similar words (synonyms, embedding neighbours), whitespace-separated; words without "
                                  "one of as many tokens are replaced by random words")
    rtd_weight: float = _opt(50.0, "electra: the weight of the discriminator's replaced-token-detection loss against "
                                   "the generator's masked-LM loss (the paper's lambda)")
    pack_documents: bool = _opt(True, "clm: concatenate documents into full windows (Megatron); false: a window never "
                                      "crosses a document's end and the last one is padded")
    unpadded: bool = _opt(False, "BERT/ERNIE: pack each micro batch's samples into as few rows as their lengths allow, "
                                 "attention kept within a sample (same loss, less padding)")
    valid_fraction: float = _opt(0.001, "fraction of documents held out for evaluation")
    num_workers: int = _opt(2, "data loader worker processes per rank")

    @property
    def paths(self) -> list[str]:
        return [self.path] if isinstance(self.path, str) else list(self.path)


@dataclass
class TrainConfig:
    steps: int = _opt(1_000_000, "optimizer steps")
    global_batch_size: int = _opt(256, "sequences per optimizer step, over all data-parallel ranks")
    micro_batch_size: int = _opt(32, "sequences per forward pass on one rank (gradient accumulation fills the rest)")
    grad_clip: float = _opt(1.0, "clip the global gradient norm to this; 0: no clipping")
    log_interval: int = _opt(10, "steps between log lines")
    eval_interval: int = _opt(1000, "steps between evaluations; 0: never")
    eval_steps: int = _opt(10, "batches per evaluation")
    deterministic: bool = _opt(False, "deterministic kernels (torch.use_deterministic_algorithms): bit-identical resume "
                                      "on GPUs too, at some speed; CPU runs are deterministic anyway")


@dataclass
class OptimizerConfig:
    name: str = _opt("adamw", " | ".join(OPTIMIZERS))
    lr: float = _opt(1e-4, "peak learning rate")
    weight_decay: float = _opt(0.01, "decoupled weight decay (not on biases and norm weights)")
    betas: list[float] = _opt([0.9, 0.999], "Adam's beta1, beta2")
    eps: float = _opt(1e-6, "Adam's epsilon")
    schedule: str = _opt("linear", "decay after warmup: " + " | ".join(SCHEDULES))
    warmup_steps: int | float = _opt(0.01, "linear warmup: a number of steps, or below 1 a fraction of train.steps")
    min_lr: float = _opt(0.0, "learning rate at the end of the decay")
    poly_power: float = _opt(1.0, "power of the poly decay")
    multi_tensor: str = _opt("auto", "auto | on | off: LAMB/AdamW arithmetic over all tensors at once (torch._foreach_*, "
                                     "apex's multi-tensor kernels on CUDA) or one tensor at a time; auto = on for CUDA "
                                     "tensors (AdamW uses torch's fused kernel wherever torch has one)")

    def warmup(self, total_steps: int) -> int:
        """The warmup length in steps."""
        return round(self.warmup_steps * total_steps) if self.warmup_steps < 1 else int(self.warmup_steps)


@dataclass
class CheckpointConfig:
    interval: int = _opt(1000, "steps between checkpoints (one is always written at the end); 0: only at the end")
    keep: int = _opt(3, "newest checkpoints kept in out_dir; 0: all")
    init_from: str = _opt("", "start from these weights (a ptm checkpoint, e.g. from `ptm convert from-hf`); model "
                              "sizes the config leaves unset are taken from it")
    allow_dataset_change: bool = _opt(False, "resume on another dataset (same tokenizer) on purpose; otherwise a resume "
                                             "refuses a checkpoint trained on other data")


@dataclass
class ParallelConfig:
    tp: int = _opt(1, "tensor-parallel size (megatron-core); data-parallel size = world size / tp")
    timeout_s: int = _opt(600, "a rank that cannot reach the master, or whose peer falls silent (dead or stalled), "
                               "ends the job after this many seconds (naming rank and host, exit 4) instead of hanging "
                               "until the time limit (a collective that hangs while every rank is alive: after twice "
                               "this)")
    heartbeat_s: float = _opt(10.0, "how often each rank tells the rendezvous store it is alive (from a thread: a long "
                                    "checkpoint write or evaluation keeps beating); below parallel.timeout_s")


@dataclass
class ZeroConfig:
    stage: int = _opt(1, "DeepSpeed ZeRO stage: 0 off, 1 optimizer states, 2 + gradients, 3 + weights")
    offload: bool = _opt(False, "keep optimizer states in CPU memory (ZeRO-Offload; needs stage >= 1)")


@dataclass
class FP16Config:
    initial_scale_power: int = _opt(16, "dynamic loss scaling starts at 2**this")
    loss_scale_window: int = _opt(1000, "overflow-free steps before the loss scale doubles")
    hysteresis: int = _opt(2, "overflows tolerated before the loss scale halves")
    min_loss_scale: float = _opt(1.0, "the loss scale never goes below this")


@dataclass
class ErnieStage:
    steps: int = _opt(0, "optimizer steps of this stage")
    tasks: dict[str, float] = _opt({}, "task name -> sampling weight (data.objective=ernie)")
    knowledge_level: str = _opt("entity", "knowledge-masking units in this stage: " + " | ".join(KNOWLEDGE_LEVELS)
                                + " (ERNIE 1.0's basic, phrase and entity stages)")


@dataclass
class ErnieConfig:
    stages: list[ErnieStage] = _opt([], "ERNIE 2.0 continual multi-task schedule, run in order: "
                                        "[{steps, tasks: {task: weight}}]; tasks: " + ", ".join(ERNIE_TASKS))
    task_data: dict[str, str] = _opt({}, "labelled datasets of " + " and ".join(USER_LABELED) + ": {task: path}")

    def stage_index(self, step: int) -> int:
        """Index of the stage that optimizer step `step` (from 0) belongs to; the last one after the schedule
        ends; 0 without stages."""
        end = 0
        for i, stage in enumerate(self.stages):
            end += stage.steps
            if step < end:
                return i
        return max(len(self.stages) - 1, 0)

    def stage_at(self, step: int) -> ErnieStage:
        """The stage that optimizer step `step` (from 0) belongs to."""
        return self.stages[self.stage_index(step)]


def _section(cls):
    return field(default_factory=cls)


@dataclass
class Config:
    seed: int = _opt(1234, "random seed: weights, data order, dropout")
    out_dir: str = _opt("runs/default", "run directory: checkpoints, logs and the resolved config")
    precision: str = _opt("fp32", "fp32 | bf16 | fp16 (mixed precision keeps fp32 master weights)")
    grad_accum_dtype: str = _opt("fp32", "with precision=bf16: accumulate and reduce gradients in fp32 (needs "
                                         "zero.stage >= 1) or bf16 (DeepSpeed's only choice at zero.stage=0)")
    deepspeed_config: str = _opt("", "a DeepSpeed JSON of your own: keys this config also sets must agree with it, "
                                     "the others (bucket sizes, overlap_comm, ...) are used as given")
    kernels: str = _opt("auto", "eager | compile | auto: compile each transformer block and the MLM/LM head with "
                                "torch.compile (Inductor fuses bias+GELU, bias+dropout+residual+LayerNorm, softmax); "
                                "auto = compile on CUDA, eager on CPU (see docs/performance.md)")
    fused_lm_loss: str = _opt("auto", "auto | on | off: liger-kernel's fused linear cross-entropy for the MLM/LM head "
                                      "(the logits are never held whole); auto = on with liger-kernel installed, on "
                                      "CUDA, parallel.tp=1, precision bf16/fp32, objectives other than ernie")
    model: ModelConfig = _section(ModelConfig)
    data: DataConfig = _section(DataConfig)
    train: TrainConfig = _section(TrainConfig)
    optimizer: OptimizerConfig = _section(OptimizerConfig)
    checkpoint: CheckpointConfig = _section(CheckpointConfig)
    parallel: ParallelConfig = _section(ParallelConfig)
    zero: ZeroConfig = _section(ZeroConfig)
    fp16: FP16Config = _section(FP16Config)
    ernie: ErnieConfig = _section(ErnieConfig)

    @classmethod
    def from_dict(cls, raw: dict) -> Config:
        return _build(cls, raw, "")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)

    def get(self, key: str):
        """The value of a dotted key, e.g. `cfg.get("train.steps")`."""
        return functools.reduce(getattr, key.split("."), self)

    def kernels_on(self, cuda: bool) -> str:
        """The `kernels` setting in effect: `auto` compiles on CUDA (where Inductor's fused Triton kernels pay for
        their compile time within minutes) under ZeRO 0 and 1, and stays eager on CPU (no faster there), under ZeRO-2
        (wrong bias gradients across data-parallel ranks: the config refuses it) and under ZeRO-3 (compiled blocks
        train the same weights there, but DeepSpeed's gather hooks split each block into many small graphs)."""
        if self.kernels != "auto":
            return self.kernels
        return "compile" if cuda and self.zero.stage < 2 else "eager"

    def lm_loss_fusable(self) -> bool:
        """Whether the fused linear cross-entropy can replace the LM head (not off, TP=1, one LM head, not fp16: it
        computes its gradients in the forward pass, before the fp16 loss scale, where small ones would underflow);
        whether it runs also depends on the device and liger-kernel (engine)."""
        return (self.fused_lm_loss != "off" and self.parallel.tp == 1 and self.precision != "fp16"
                and objectives.get(self.data.objective).one_lm_head)

    def validate(self, dp: int = 1) -> None:
        """Raise ConfigError listing every problem (one line each, with the fix) for `dp` data-parallel ranks."""
        errors = _range_errors(self, dp)
        if not errors:  # the relations below divide by values checked above
            errors = _relation_errors(self, dp)
        if errors:
            raise ConfigError("\n".join(errors))


# ---------------------------------------------------------------------------------------------- loading

def load(path: str, overrides: typing.Iterable[str] = ()) -> Config:
    """A YAML file (or preset name) with its `base` chain, then `key=value` overrides (--set)."""
    raw = _read(_resolve(path, os.getcwd()), ())
    for item in overrides:
        _override(raw, item)
    cfg = _build(Config, raw, "")
    cfg.explicit = frozenset(_dotted(raw))  # keys a file or override gave (the rest are the defaults)
    return cfg


def _dotted(raw: dict, cls=None, prefix: str = ""):
    """The dotted keys of a raw config mapping, down to the sections' values."""
    hints = _hints(cls or Config)
    for key, value in raw.items():
        if dataclasses.is_dataclass(hints.get(key)) and isinstance(value, dict):
            yield from _dotted(value, hints[key], f"{prefix}{key}.")
        else:
            yield prefix + key


def _resolve(name: str, relative_to: str) -> str:
    path = os.path.join(relative_to, name)
    if os.path.isfile(path):
        return path
    preset = os.path.join(PRESETS_DIR, name if name.endswith(".yaml") else f"{name}.yaml")
    if os.sep not in name and os.path.isfile(preset):
        return preset
    presets = sorted(f[:-5] for f in os.listdir(PRESETS_DIR) if f.endswith(".yaml"))
    raise ConfigError(f"config file {name} not found in {relative_to}; "
                      f"give a path to a YAML file or a preset: {', '.join(presets)}")


def _read(path: str, chain: tuple[str, ...]) -> dict:
    """The file's keys merged over those of its `base` chain; each file is checked on its own."""
    real = os.path.realpath(path)
    if real in chain:
        raise ConfigError(f"{path}: `base` loops back: {' -> '.join((*chain, real))}")
    with open(path, encoding="utf-8") as f:
        try:
            raw = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got {type(raw).__name__}")
    base = raw.pop("base", None)
    try:
        _build(Config, raw, "")
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    if base is None:
        return raw
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base must be a file name, got {base!r}")
    return _merge(_read(_resolve(base, os.path.dirname(path)), (*chain, real)), raw)


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        _put(out, key, value)
    return out


def _put(node: dict, key: str, value) -> None:
    """node[key] = value, merging mappings key by key."""
    both = isinstance(value, dict) and isinstance(node.get(key), dict)
    node[key] = _merge(node[key], value) if both else value


def _override(raw: dict, item: str) -> None:
    """Apply one `dotted.key=value` to the raw mapping; the value is YAML unless the field takes a string."""
    key, eq, text = item.partition("=")
    key = key.strip()
    if not eq or not key:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.steps=1000")
    parts = key.split(".")
    cls, node = Config, raw
    for i, name in enumerate(parts):
        hints = _hints(cls)
        if name not in hints:
            raise ConfigError(f"--set {item}: {_unknown('.'.join(parts[:i]), name, cls)}")
        hint = hints[name]
        if i == len(parts) - 1:
            return _put(node, name, _parse(text, hint, item, key))
        if typing.get_origin(hint) is dict and i == len(parts) - 2:
            return _put(_child(node, name), parts[-1], _parse(text, typing.get_args(hint)[1], item, key))
        if not dataclasses.is_dataclass(hint):
            raise ConfigError(f"--set {item}: {'.'.join(parts[:i + 1])} is a value ({_type_name(hint)}), not a section")
        cls, node = hint, _child(node, name)


def _child(node: dict, name: str) -> dict:
    if not isinstance(node.get(name), dict):
        node[name] = {}
    return node[name]


def _parse(text: str, hint, item: str, key: str):
    """A --set value: YAML (numbers, booleans, lists, null), except that string fields take the text as is;
    checked against the field's type here so that errors name the --set."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    unions = (typing.Union, types.UnionType)
    takes_str = hint is str or (typing.get_origin(hint) in unions and str in typing.get_args(hint))
    if takes_str and not isinstance(value, (list, dict)):
        value = text
    try:
        _coerce(value, hint, key)
    except ConfigError as e:
        raise ConfigError(f"--set {item}: {e}") from None
    return value


# ------------------------------------------------------------------------------------------ coercion

@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _unknown(section: str, key: str, cls) -> str:
    where = f"{section}." if section else ""
    return (f"unknown key '{where}{key}'; valid keys of {section or 'the top level'}: "
            f"{', '.join(_hints(cls))}")


def _build(cls, raw, where: str):
    """Dataclass `cls` from a mapping; `where` is the dotted prefix of its keys (for messages)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where.rstrip('.') or 'config'}: expected a mapping, got {raw!r}")
    hints = _hints(cls)
    for key in raw:
        if key not in hints:
            raise ConfigError(_unknown(where.rstrip("."), key, cls))
    return cls(**{key: _coerce(value, hints[key], where + key) for key, value in raw.items()})


_BOOLS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def _coerce(value, hint, key: str):
    """`value` as type `hint` (int, float, bool, str, lists, dicts, unions, Optional, dataclasses)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, key + ".")
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if value is None and len(options) < len(args):
            return None
        if len(options) == 1:  # Optional[X]: X's own message
            return _coerce(value, options[0], key)
        for arg in options:
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                pass
    elif origin is list and isinstance(value, (list, tuple)):
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    elif origin is dict and isinstance(value, dict):
        return {str(k): _coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
    elif hint is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in _BOOLS:
            return _BOOLS[str(value).lower()]
    elif hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    elif hint in (int, float) and not isinstance(value, bool):
        number = _number(value)
        if hint is float and number is not None:
            return float(number)
        if hint is int and number is not None and float(number).is_integer():
            return int(number)
    raise ConfigError(f"{key}: expected {_type_name(hint)}, got {value!r}")


def _number(value) -> int | float | None:
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):  # YAML reads 1e-4 (no dot) as a string
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
    return None


def _type_name(hint) -> str:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in args)
    if args:
        return f"{typing.get_origin(hint).__name__}[{', '.join(map(_type_name, args))}]"
    return hint.__name__


# ------------------------------------------------------------------------------------------- listing

def _leaves(cls, prefix: str = ""):
    """(dotted key, type, default, help) of every value field, sections flattened."""
    for f in dataclasses.fields(cls):
        hint = _hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            yield from _leaves(hint, f"{prefix}{f.name}.")
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        help_ = f.metadata.get("help") or (MODEL_HELP.get(f.name, "") if cls is ModelConfig else "")
        yield prefix + f.name, hint, default, help_


def keys() -> list[str]:
    """Every dotted key of the config."""
    return [key for key, *_ in _leaves(Config)]


def describe() -> str:
    """Every key with its type, default and description, one per line (for `train --help`)."""
    rows = [(key, _type_name(hint), json.dumps(default), help_) for key, hint, default, help_ in _leaves(Config)]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(f"{k:<{widths[0]}}  {t:<{widths[1]}}  {d:<{widths[2]}}  {h}" for k, t, d, h in rows)


# ----------------------------------------------------------------------------------------- validation

_POSITIVE = ("model.max_relative_position", "model.vocab_pad_to", "model.hidden_size", "model.num_layers", "model.num_heads", "model.ffn_hidden_size",
             "model.max_position_embeddings", "model.init_std", "model.layer_norm_eps", "data.seq_len",
             "train.steps", "train.global_batch_size", "train.micro_batch_size", "train.log_interval",
             "train.eval_steps", "optimizer.lr", "optimizer.eps", "parallel.tp", "parallel.timeout_s",
             "parallel.heartbeat_s", "fp16.loss_scale_window",
             "fp16.hysteresis", "fp16.min_loss_scale")
_NON_NEGATIVE = ("data.rtd_weight", "model.vocab_size", "model.embedding_size", "model.type_vocab_size", "model.task_type_vocab_size",
                 "data.max_predictions_per_seq", "data.num_workers", "train.grad_clip", "train.eval_interval",
                 "optimizer.weight_decay", "optimizer.warmup_steps", "optimizer.min_lr", "optimizer.poly_power",
                 "checkpoint.interval", "checkpoint.keep", "fp16.initial_scale_power")
_UNIT = {"[0, 1)": lambda x: 0 <= x < 1, "(0, 1)": lambda x: 0 < x < 1, "[0, 1]": lambda x: 0 <= x <= 1}
_FRACTIONS = {"model.generator_size": "[0, 1]", "model.hidden_dropout": "[0, 1)", "model.attention_dropout": "[0, 1)", "data.mask_prob": "(0, 1)",
              "data.short_seq_prob": "[0, 1]", "data.valid_fraction": "[0, 1)"}
_CHOICES = {"kernels": ("auto", "eager", "compile"), "fused_lm_loss": ("auto", "on", "off"),
            "optimizer.multi_tensor": ("auto", "on", "off"), "precision": PRECISIONS, "grad_accum_dtype": GRAD_ACCUM_DTYPES,
            "model.arch": ARCHS, "data.objective": tuple(OBJECTIVES),
            "data.masking": tuple(MASKINGS), "optimizer.name": OPTIMIZERS, "optimizer.schedule": SCHEDULES,
            "zero.stage": (0, 1, 2, 3)}


class _Problems(list):
    def need(self, ok: bool, message: str) -> None:
        if not ok:
            self.append(message)


def _range_errors(cfg: Config, dp: int) -> list[str]:
    """Values that are wrong on their own: choices, signs, ranges."""
    errors = _Problems()
    for k, choices in _CHOICES.items():
        errors.need(cfg.get(k) in choices, f"{k}={cfg.get(k)!r} is not one of {' | '.join(map(str, choices))}; "
                                           f"set {k} to one of them")
    if cfg.model.arch in ARCHS:  # else the features are unset, and the arch's error says it all
        for k, choices in (("model.norm", NORMS), ("model.activation", ACTIVATIONS),
                           ("model.position_encoding", POSITIONS), ("model.share_layers", SHARING)):
            errors.need(cfg.get(k) in choices, f"{k}={cfg.get(k)!r} is not one of {' | '.join(choices)}; "
                                               f"set {k} to one of them")
        heads = cfg.model.heads
        errors.need(all(h in HEADS for h in heads) and sum(h in heads for h in ("lm", "mlm", "rtd")) == 1
                    and not ("rtd" in heads and "nsp" in heads),
                    f"model.heads={heads} is not one LM head and optionally nsp; set it to [lm], [mlm] or either "
                    f"with nsp, or [rtd] (ELECTRA)")
    for k in _POSITIVE:
        errors.need(cfg.get(k) > 0, f"{k}={cfg.get(k)} must be positive; set {k} to a value > 0")
    for k in _NON_NEGATIVE:
        errors.need(cfg.get(k) >= 0, f"{k}={cfg.get(k)} must not be negative; set {k} to a value >= 0")
    for k, interval in _FRACTIONS.items():
        errors.need(_UNIT[interval](cfg.get(k)), f"{k}={cfg.get(k)} is outside {interval}; "
                                                 f"set {k} to a value in {interval}")
    betas = cfg.optimizer.betas
    errors.need(len(betas) == 2 and all(0 <= b < 1 for b in betas),
                f"optimizer.betas={betas} must be two values in [0, 1); e.g. set optimizer.betas=[0.9,0.999]")
    errors.need(dp >= 1, f"data-parallel size {dp} must be positive; launch at least parallel.tp processes")
    errors.need(cfg.data.paths and all(cfg.data.paths),
                "data.path is empty; set data.path=DIR (a dataset built by `ptm prep`) or a list of them")
    return errors


def _relation_errors(cfg: Config, dp: int) -> list[str]:
    """Values that do not fit together."""
    m, d, t, o, tp = cfg.model, cfg.data, cfg.train, cfg.optimizer, cfg.parallel.tp
    errors = _Problems()
    errors.need(m.hidden_size % m.num_heads == 0, f"model.hidden_size={m.hidden_size} is not divisible by "
                                                  f"model.num_heads={m.num_heads}; make it a multiple of the heads")
    for k in ("model.hidden_size", "model.ffn_hidden_size", "model.num_heads", "model.vocab_pad_to"):
        errors.need(cfg.get(k) % tp == 0, f"{k}={cfg.get(k)} is not divisible by parallel.tp={tp}; "
                                          f"use a parallel.tp that divides it")
    per_step = t.micro_batch_size * dp
    errors.need(t.global_batch_size % per_step == 0,
                f"train.global_batch_size={t.global_batch_size} is not divisible by train.micro_batch_size x "
                f"data-parallel size = {t.micro_batch_size} x {dp} = {per_step}; "
                f"set train.global_batch_size to a multiple of {per_step}")
    needed = positions_needed(m, d.seq_len)
    errors.need(needed <= m.max_position_embeddings,
                f"data.seq_len={d.seq_len} needs {needed} positions but model.max_position_embeddings="
                f"{m.max_position_embeddings}; lower data.seq_len or raise model.max_position_embeddings"
                + (f" (position_encoding=roberta starts at pad_token_id + 1 = {m.pad_token_id + 1})"
                   if needed > d.seq_len else ""))
    errors.need(d.max_predictions_per_seq <= d.seq_len,
                f"data.max_predictions_per_seq={d.max_predictions_per_seq} exceeds data.seq_len={d.seq_len}; "
                f"lower it (0: ceil(mask_prob * seq_len))")
    errors.need(d.weights is None or (len(d.weights) == len(d.paths) and all(w > 0 for w in d.weights)),
                f"data.weights={d.weights} must be one positive weight per data.path ({len(d.paths)}); "
                f"fix the list or remove data.weights")
    layers = m.activation_checkpointing
    errors.need(isinstance(layers, bool) or all(0 <= i < m.num_layers for i in layers),
                f"model.activation_checkpointing={layers} names layers outside 0..{m.num_layers - 1}; "
                f"list existing layer indices or use true")
    errors.need("lm" not in m.heads or embedding_width(m) == m.hidden_size,
                f"model.embedding_size={m.embedding_size} differs from model.hidden_size={m.hidden_size}, but the lm "
                f"head projects hidden states onto the word embeddings; use the mlm head or model.embedding_size=0")
    errors.need(("rtd" in m.heads) == (m.generator_size > 0),
                f"model.generator_size={m.generator_size} with model.heads={m.heads}: ELECTRA's rtd head trains with a "
                f"generator and only it has one; set model.generator_size to a fraction in (0, 1] with heads [rtd], "
                f"else 0")
    if "rtd" in m.heads and 0 < m.generator_size <= 1:
        g = generator_config(m)
        errors.need(g.hidden_size % g.num_heads == 0 and g.num_heads % tp == 0 and g.ffn_hidden_size % tp == 0,
                    f"model.generator_size={m.generator_size} gives a generator of hidden size {g.hidden_size}, "
                    f"{g.num_heads} heads and MLP width {g.ffn_hidden_size}, which parallel.tp={tp} and the heads must "
                    f"divide; pick a fraction that keeps them whole (e.g. 1/4 or 1/3 of a 12-head model)")
    errors.need(not d.similar_words or d.masking == "correction",
                f"data.similar_words is set but data.masking={d.masking}; similar words replace masked words only with "
                "data.masking=correction (MacBERT): set it, or remove data.similar_words")
    errors.need(not d.similar_words or os.path.isfile(d.similar_words),
                f"data.similar_words={d.similar_words} not found; give a UTF-8 file of words and their similar words")
    errors.need(m.task_type_vocab_size == 0 or m.arch == "ernie",
                f"model.task_type_vocab_size={m.task_type_vocab_size} needs model.arch=ernie; set it to 0")
    errors.need(o.warmup_steps < 1 or float(o.warmup_steps).is_integer(),
                f"optimizer.warmup_steps={o.warmup_steps} is neither whole steps nor a fraction below 1; round it")
    errors.need(o.warmup(t.steps) <= t.steps, f"optimizer.warmup_steps={o.warmup_steps} is longer than "
                                              f"train.steps={t.steps}; shorten the warmup")
    errors.need(o.min_lr <= o.lr, f"optimizer.min_lr={o.min_lr} exceeds optimizer.lr={o.lr}; lower optimizer.min_lr")
    errors.need(cfg.parallel.heartbeat_s < cfg.parallel.timeout_s,
                f"parallel.heartbeat_s={cfg.parallel.heartbeat_s} is not below parallel.timeout_s="
                f"{cfg.parallel.timeout_s}: a rank would be called silent between two beats; lower parallel.heartbeat_s")
    errors.need(not cfg.zero.offload or cfg.zero.stage >= 1,
                "zero.offload needs ZeRO; set zero.stage=1 (or higher) or zero.offload=false")
    errors.need(cfg.precision != "bf16" or cfg.grad_accum_dtype == "bf16" or cfg.zero.stage >= 1,
                "precision=bf16 with grad_accum_dtype=fp32 needs ZeRO (DeepSpeed accumulates bf16 gradients in bf16 at "
                "zero.stage=0); set zero.stage=1 or grad_accum_dtype=bf16")
    errors.need(cfg.kernels != "compile" or cfg.zero.stage != 2 or dp == 1,
                f"kernels=compile with zero.stage=2 over {dp} data-parallel ranks trains wrong bias gradients "
                f"(DeepSpeed 0.19's ZeRO-2 reduction hooks with torch.compile); set zero.stage=1 or 3, or kernels=eager")
    errors.need(cfg.fused_lm_loss != "on" or tp == 1,
                f"fused_lm_loss=on needs the whole vocabulary on one rank: parallel.tp={tp}; set fused_lm_loss=auto "
                f"(on where it applies) or off")
    errors.need(cfg.fused_lm_loss != "on" or cfg.precision != "fp16",
                "fused_lm_loss=on with precision=fp16: liger-kernel computes the LM head's gradients before the fp16 "
                "loss scale, where small ones underflow; use precision=bf16, or fused_lm_loss=auto (off under fp16)")
    for task in cfg.ernie.task_data:
        errors.need(task in USER_LABELED, f"ernie.task_data.{task}: only {' and '.join(USER_LABELED)} "
                                          f"take a dataset; remove it")
    for i, stage in enumerate(cfg.ernie.stages):
        errors.need(stage.knowledge_level in KNOWLEDGE_LEVELS,
                    f"ernie.stages[{i}].knowledge_level={stage.knowledge_level!r}: use one of {', '.join(KNOWLEDGE_LEVELS)}")
    objectives.get(d.objective).check(cfg, errors.need)
    return errors
