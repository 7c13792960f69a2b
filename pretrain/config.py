"""The training config: nested dataclasses whose fields carry their help, choices and range (pretrain/schema.py),
loaded from YAML with dotted overrides (pretrain/yaml_config.py), validated before training.

    cfg = load("configs/bert-base.yaml", ["train.steps=1000", "optimizer.name=lamb"])
    cfg.validate(dp=world_size // cfg.parallel.tp)
    notes = cfg.ignored()                     # keys a base of another objective or model gave: not read
    text = cfg.to_yaml()                      # the resolved config (checkpoints keep it)

The sections are the core ones below plus those the objective plug-ins own (`ernie`, `electra`, ...: each
objective module declares its section, with the checks that go with it); families own rules of their own. What is
left here relates the core sections to each other.

Keys that only some objectives, position encodings or attention kinds read (`Objective.keys_read`,
`PositionEncoding.keys`, `ATTENTIONS`) are refused where the config's do not read them and they are given at or after
the layer that chose (the file that sets data.objective, a file based on it, a --set); given only by an earlier base
(a preset of another objective) or by a config written out whole (a run's config.yaml), they are accepted, and
`Config.ignored` names them for the run's log and `ptm plan`.
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import math
import os
import typing
from dataclasses import dataclass, field

import yaml

from pretrain import families, objectives, schema
from pretrain import yaml_config as Y
from pretrain.models.config import ATTENTIONS, FEATURES, POSITIONS, ModelConfig, embedding_width, positions_needed
from pretrain.data import masking
from pretrain.data.masking import STRATEGIES as MASKINGS
from pretrain.schema import AUTO, opt
from pretrain.yaml_config import ConfigError
from ptm import shipped

PRESETS_DIR = shipped("presets", "configs")
PRECISIONS = ("fp32", "bf16", "fp16")
GRAD_ACCUM_DTYPES = ("fp32", "bf16")
OPTIMIZERS = ("adamw", "lamb")
SCHEDULES = ("linear", "poly", "cosine", "constant")
OBJECTIVES = {name: o.help for name, o in objectives.REGISTRY.items()}
__all__ = ["Config", "ConfigError", "load", "keys", "describe"]


@dataclass
class DataConfig:
    path: str | list[str] = opt("", "dataset directory built by `ptm prep`, or a list of them to blend")
    weights: list[float] | None = opt(None, "sampling weight of each data.path (default: by size)")
    seq_len: int = opt(512, "tokens per training sequence", range="> 0")
    objective: str = opt("mlm_nsp", " | ".join(OBJECTIVES), choices=lambda: tuple(objectives.REGISTRY))
    mask_prob: float = opt(0.15, "fraction of tokens masked (masked-LM objectives)", range="(0, 1)")
    max_predictions_per_seq: int = opt(0, "most masked tokens per sequence; 0: ceil(mask_prob * seq_len)",
                                       range=">= 0")
    masking: str = opt("token", " | ".join(MASKINGS), choices=tuple(MASKINGS))
    short_seq_prob: float = opt(0.1, "probability of a shorter sequence (BERT's short_seq_prob)", range="[0, 1]")
    similar_words: str = opt("", "data.masking=correction (MacBERT): a UTF-8 file, one word per line followed by its "
                                 "similar words (synonyms, embedding neighbours), whitespace-separated; words without "
                                 "one of as many tokens are replaced by random words")
    pack_documents: bool = opt(True, "clm: concatenate documents into full windows (Megatron); false: a window never "
                                     "crosses a document's end and the last one is padded")
    unpadded: bool = opt(False, "BERT/ERNIE: pack each micro batch's samples into as few rows as their lengths allow, "
                                "attention kept within a sample (same loss, less padding)")
    streams: bool = opt(False, "read the windows as streams of the global batch, in the order a memory "
                               "(model.mem_len > 0) always reads them: a run without a memory on a memory run's order")
    valid_fraction: float = opt(0.001, "fraction of documents held out for evaluation", range="[0, 1)")
    num_workers: int = opt(2, "data loader worker processes per rank", range=">= 0")

    @property
    def paths(self) -> list[str]:
        return [self.path] if isinstance(self.path, str) else list(self.path)


@dataclass
class TrainConfig:
    steps: int = opt(1_000_000, "optimizer steps", range="> 0")
    global_batch_size: int = opt(256, "sequences per optimizer step, over all data-parallel ranks", range="> 0")
    micro_batch_size: int | str = opt(AUTO, "sequences per forward pass on one rank (gradient accumulation fills the "
                                            "rest); auto: the largest that fits the GPU's memory (ptm plan's "
                                            "estimate) and divides global_batch_size / data-parallel size",
                                      range="> 0")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this; 0: no clipping", range=">= 0")
    log_interval: int = opt(10, "steps between log lines", range="> 0")
    eval_interval: int = opt(1000, "steps between evaluations; 0: only the one every run ends with", range=">= 0")
    eval_steps: int = opt(10, "global batches per evaluation: the first eval_steps x global_batch_size held-out "
                              "sequences (at most the whole batches the held-out split fills), each data-parallel "
                              "rank reading its share in micro batches (the same sequences, so the same held-out "
                              "metrics, under any layout)", range="> 0")
    deterministic: bool = opt(False, "deterministic kernels (torch.use_deterministic_algorithms): bit-identical resume "
                                     "on GPUs too, at some speed; CPU runs are deterministic anyway")
    skip_steps: list[list[int]] = opt([], "steps left out, as [first, last] pairs (numbered as in metrics.jsonl): "
                                          "their global batches are not trained on, the learning-rate schedule and "
                                          "the data move on past them (a loss spike's batches: README \"Loss "
                                          "spikes\"); e.g. [[1201, 1300]]")

    batch_rampup: list[int] = opt([], "grow the global batch from START by INCREMENT sequences in equal shares of "
                                      "SAMPLES sequences, global_batch_size from there on: [START, INCREMENT, SAMPLES] "
                                      "(Megatron's --rampup-batch-size; GPT-3's ramp), START and INCREMENT multiples "
                                      "of the data-parallel size; a step's micro batch is the largest divisor of its "
                                      "per-rank batch up to micro_batch_size; the learning-rate schedule counts "
                                      "samples, in steps of global_batch_size; []: the whole batch from step 1")

    def batch_at(self, consumed: int) -> int:
        """The global batch of the step that starts at sample `consumed` (as Megatron's ramp: START plus an
        INCREMENT for each whole share of SAMPLES / increments consumed)."""
        if not self.batch_rampup:
            return self.global_batch_size
        start, increment, samples = self.batch_rampup
        increments = (self.global_batch_size - start) // increment
        return start + min(increments, consumed * increments // samples) * increment

    def samples_before(self, step: int) -> int:
        """The samples the steps before step `step` (from 0) read."""
        if not self.batch_rampup:
            return step * self.global_batch_size
        steps, before, batches = _ramp(self.global_batch_size, *self.batch_rampup)
        i = bisect.bisect_right(steps, step) - 1
        return before[i] + (step - steps[i]) * batches[i]

    def batch_unit(self) -> int:
        """The largest batch that every step's global batch is a whole number of."""
        return math.gcd(self.global_batch_size, *self.batch_rampup[:2])

    def skipped(self, step: int) -> tuple[int, int] | None:
        """The (first, last) step of the train.skip_steps range that holds `step` (from 1), ranges that overlap or
        touch joined; None where none does."""
        joined: list[tuple[int, int]] = []
        for first, last in sorted(map(tuple, self.skip_steps)):
            if joined and first <= joined[-1][1] + 1:
                joined[-1] = (joined[-1][0], max(joined[-1][1], last))
            else:
                joined.append((first, last))
        return next(((first, last) for first, last in joined if first <= step <= last), None)


@functools.lru_cache(maxsize=4)
def _ramp(total: int, start: int, increment: int, samples: int) -> tuple[list[int], list[int], list[int]]:
    """A batch ramp in stretches of steps of one batch: (the first step of each, the samples read before it, its
    batch), the last stretch the whole batch's; one stretch per increment at most."""
    train = TrainConfig(global_batch_size=total, batch_rampup=[start, increment, samples])
    increments = (total - start) // increment
    steps, before, batches = [0], [0], [start]
    while batches[-1] < total:  # the stretch ends where the samples read reach the next increment's share
        share = (batches[-1] - start) // increment + 1
        until = -(-share * samples // increments)  # (the first count of samples at that share)
        n = -(-(until - before[-1]) // batches[-1])
        steps.append(steps[-1] + n)
        before.append(before[-1] + n * batches[-1])
        batches.append(train.batch_at(before[-1]))
    return steps, before, batches


@dataclass
class OptimizerConfig:
    name: str = opt("adamw", " | ".join(OPTIMIZERS), choices=OPTIMIZERS)
    lr: float = opt(1e-4, "peak learning rate", range="> 0")
    weight_decay: float = opt(0.01, "decoupled weight decay (not on biases and norm weights)", range=">= 0")
    betas: list[float] = opt([0.9, 0.999], "Adam's beta1, beta2")
    eps: float = opt(1e-6, "Adam's epsilon", range="> 0")
    schedule: str = opt("linear", "decay after warmup: " + " | ".join(SCHEDULES), choices=SCHEDULES)
    warmup_steps: int | float = opt(0.01, "linear warmup: a number of steps, or below 1 a fraction of train.steps",
                                    range=">= 0")
    min_lr: float = opt(0.0, "learning rate at the end of the decay", range=">= 0")
    decay_steps: int | float = opt(0, "the decay ends at this step and min_lr holds after it: a number of steps, or "
                                      "below 1 a fraction of train.steps; 0: at train.steps (GPT-3 ends its decay at "
                                      "260B of its 300B tokens)", range=">= 0")
    poly_power: float = opt(1.0, "power of the poly decay", range=">= 0")
    multi_tensor: str = opt("auto", "auto | on | off: LAMB/AdamW arithmetic over all tensors at once (torch._foreach_*, "
                                    "apex's multi-tensor kernels on CUDA) or one tensor at a time; auto = on for CUDA "
                                    "tensors (AdamW uses torch's fused kernel wherever torch has one)",
                            choices=("auto", "on", "off"))

    def warmup(self, total_steps: int) -> int:
        """The warmup length in steps."""
        return round(self.warmup_steps * total_steps) if self.warmup_steps < 1 else int(self.warmup_steps)

    def decay_end(self, total_steps: int) -> int:
        """The step the decay ends at."""
        if not self.decay_steps:
            return total_steps
        return round(self.decay_steps * total_steps) if self.decay_steps < 1 else int(self.decay_steps)


@dataclass
class CheckpointConfig:
    interval: int = opt(1000, "steps between checkpoints (one is always written at the end); 0: only at the end",
                        range=">= 0")
    keep: int = opt(3, "newest checkpoints kept in out_dir; 0: all", range=">= 0")
    init_from: str = opt("", "start from these weights (a ptm checkpoint, e.g. from `ptm convert from-hf`); model "
                             "sizes the config leaves unset are taken from it")
    allow_dataset_change: bool = opt(False, "resume on another dataset (same tokenizer) on purpose; otherwise a resume "
                                            "refuses a checkpoint trained on other data")


@dataclass
class ParallelConfig:
    tp: int = opt(1, "tensor-parallel size (megatron-core); data-parallel size = world size / tp", range="> 0")
    timeout_s: int = opt(600, "a rank that cannot reach the master, or whose peer falls silent (dead or stalled), "
                              "ends the job after this many seconds (naming rank and host, exit 4) instead of hanging "
                              "until the time limit (a collective that hangs while every rank is alive: after twice "
                              "this)", range="> 0")
    heartbeat_s: float = opt(10.0, "how often each rank tells the rendezvous store it is alive (from a thread: a long "
                                   "checkpoint write or evaluation keeps beating); below parallel.timeout_s",
                             range="> 0")


@dataclass
class ZeroConfig:
    stage: int = opt(1, "DeepSpeed ZeRO stage: 0 off, 1 optimizer states, 2 + gradients, 3 + weights",
                     choices=(0, 1, 2, 3))
    offload: bool = opt(False, "keep optimizer states in CPU memory (ZeRO-Offload; needs stage >= 1)")


@dataclass
class FP16Config:
    initial_scale_power: int = opt(16, "dynamic loss scaling starts at 2**this (Megatron's start: 32; a step whose "
                                       "gradients overflow is skipped and halves it; DeepSpeed's loss scaler takes "
                                       "2**63 at most)", range="[0, 63]")
    loss_scale_window: int = opt(1000, "overflow-free steps before the loss scale doubles", range="> 0")
    hysteresis: int = opt(2, "overflows tolerated before the loss scale halves", range="> 0")
    min_loss_scale: float = opt(1.0, "the loss scale never goes below this", range="> 0")


@dataclass
class CoreConfig:
    seed: int = opt(1234, "random seed: weights, data order, dropout")
    out_dir: str = opt("runs/default", "run directory: checkpoints, logs and the resolved config")
    precision: str = opt("fp32", "fp32 | bf16 | fp16 (mixed precision keeps fp32 master weights)", choices=PRECISIONS)
    grad_accum_dtype: str = opt("fp32", "with precision=bf16: accumulate and reduce gradients in fp32 (needs "
                                        "zero.stage >= 1) or bf16 (DeepSpeed's only choice at zero.stage=0)",
                                choices=GRAD_ACCUM_DTYPES)
    deepspeed_config: str = opt("", "a DeepSpeed JSON of your own: keys this config also sets must agree with it, "
                                    "the others (bucket sizes, overlap_comm, ...) are used as given")
    kernels: str = opt("auto", "eager | compile | auto: compile each transformer block and the MLM/LM head with "
                               "torch.compile (Inductor fuses bias+GELU, bias+dropout+residual+LayerNorm, softmax); "
                               "auto = eager (compiled blocks measured slower on an H200; docs/performance.md)",
                       choices=("auto", "eager", "compile"))
    fused_lm_loss: str = opt("auto", "auto | on | off: liger-kernel's fused linear cross-entropy for the MLM/LM head "
                                     "(the logits are never held whole); auto = on with liger-kernel installed, on "
                                     "CUDA, parallel.tp=1, precision bf16/fp32, objectives other than ernie",
                             choices=("auto", "on", "off"))
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    fp16: FP16Config = field(default_factory=FP16Config)

    @classmethod
    def from_dict(cls, raw: dict) -> "Config":
        return Y.build(Config, raw)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)

    def get(self, key: str):
        """The value of a dotted key, e.g. `cfg.get("train.steps")`."""
        return functools.reduce(getattr, key.split("."), self)

    def kernels_on(self, cuda: bool) -> str:
        """The `kernels` setting in effect: `auto` runs the blocks eager everywhere. Compiled blocks were slower than
        eager ones on the one GPU measured (an H200, BERT-base and BERT-large, bf16 and fp32, twice: more launches
        and no less GPU time; docs/performance.md); they stay a choice (`compile`), refused under ZeRO-2 with more
        than one data-parallel rank (wrong bias gradients)."""
        return "eager" if self.kernels == "auto" else self.kernels

    def lm_loss_fusable(self) -> bool:
        """Whether the fused linear cross-entropy can replace the LM head (not off, TP=1, one LM head, not fp16: it
        computes its gradients in the forward pass, before the fp16 loss scale, where small ones would underflow);
        whether it runs also depends on the device and liger-kernel (engine)."""
        return (self.fused_lm_loss != "off" and self.parallel.tp == 1 and self.precision != "fp16"
                and objectives.get(self.data.objective).one_lm_head)

    def ignored(self) -> list[str]:
        """A line for each key that this config's objective or model does not read and that is accepted, given by an
        earlier base than the choice (a preset of another objective) or by a config written out whole, with a value
        other than its default (one that is the default changes nothing)."""
        return [line for refused, line in _unread(self) if not refused]

    def validate(self, dp: int = 1, paths: bool = True) -> None:
        """Raise ConfigError listing every problem (one line each, with the fix) for `dp` data-parallel ranks;
        `paths`: out_dir's too (not for `ptm plan`, which writes nothing)."""
        errors = _range_errors(self, dp)
        if paths:
            errors += _path_errors(self)
        if not errors:  # the relations below divide by values checked above
            errors = _relation_errors(self, dp)
        if errors:
            raise ConfigError("\n".join(errors))


# the sections the objective plug-ins own (pretrain/objectives/), after the core ones
Config = dataclasses.make_dataclass(
    "Config", [(s.name, s.schema, field(default_factory=s.schema)) for s in objectives.sections()], bases=(CoreConfig,))
Config.__doc__ = "The training config: the core sections and those of the objective plug-ins."
Config.__module__ = __name__


MOVED = {"data.rtd_weight": "electra.rtd_weight"}  # where earlier versions' config.yaml files (run dirs) had keys
WRITTEN_WHOLE = ("model", "data", "train", "optimizer", "checkpoint", "parallel", "zero", "fp16")  # the sections
# every version's run config.yaml (`to_yaml`: every key) has held: a file without `base` that gives them all is one


@dataclass(frozen=True)
class Provenance:
    """Where the keys of a loaded config come from: `layers`, the files (the first base first) then "--set" (the
    command line's items, one layer); `origin`, each dotted key given -> the index of the last layer that gave it;
    `since`, each -> the first layer of those that gave it its final value in a row (a base's choice that a later
    layer restates is the base's); `whole`, the indices of the files written out whole (a run's config.yaml, which
    holds every key)."""

    layers: tuple[str, ...]
    origin: dict
    since: dict
    whole: frozenset

    def chose(self, key: str) -> int:
        """The layer that made the choice `key` holds (`since`); a model feature left to the arch (null:
        position_encoding, attention_layers, ...) was chosen with model.arch; -1: by the defaults."""
        if key in self.since:
            return self.since[key]
        section, _, name = key.partition(".")
        return self.since.get("model.arch", -1) if section == "model" and name in FEATURES else -1


def load(path: str, overrides: typing.Iterable[str] = ()) -> Config:
    """A YAML file (or preset name) with its `base` chain, then `key=value` overrides (--set). A run directory's
    config.yaml written by an earlier version reads too (`MOVED`)."""
    files = Y.layers(Y.resolve(path, os.getcwd(), PRESETS_DIR), Config, PRESETS_DIR, moved=MOVED)
    raw, given = {}, {}  # dotted key -> [(layer, value)], in order
    for i, (_, layer) in enumerate(files):
        raw = Y.merge(raw, layer, Config)
        for key in Y.dotted(layer, Config):
            given.setdefault(key, []).append((i, _value(layer, key)))
    for item in overrides:
        Y.override(raw, item, Config)
        for key in Y.given(item, Config):
            given.setdefault(key, []).append((len(files), _value(raw, key)))
    origin = {key: values[-1][0] for key, values in given.items()}
    since = {key: _first_of_final(values) for key, values in given.items()}
    cfg = Y.build(Config, raw)
    cfg.explicit = frozenset(Y.dotted(raw, Config))  # keys a file or override gave (the rest are the defaults)
    whole = all(isinstance(files[0][1].get(s), dict) for s in WRITTEN_WHOLE)  # (only the first base has no base)
    cfg.provenance = Provenance((*(name for name, _ in files), "--set"), origin, since,
                                frozenset({0} if whole else ()))
    return cfg


def _first_of_final(values: list) -> int:
    """Of [(layer, value)] in order, the first layer of the last run that gave the final value."""
    first = values[-1][0]
    for layer, value in reversed(values):
        if value != values[-1][1]:
            break
        first = layer
    return first


def _value(raw: dict, key: str):
    """The value of dotted `key` in a raw config mapping."""
    for part in key.split("."):
        raw = raw.get(part) if isinstance(raw, dict) else None
    return raw


def keys() -> list[str]:
    """Every dotted key of the config."""
    return [key for key, *_ in schema.leaves(Config)]


def describe(width: int | None = None) -> str:
    """Every key with its type, default and description, a table wrapped within `width` columns (default: the
    terminal's; for `train --help`)."""
    return schema.describe(Config, width)


# ----------------------------------------------------------------------------------------- validation

class _Problems(list):
    def need(self, ok: bool, message: str) -> None:
        if not ok:
            self.append(message)


def _range_errors(cfg: Config, dp: int) -> list[str]:
    """Values that are wrong on their own: each field's choices and range, and a few shapes."""
    errors = _Problems(schema.problems(cfg))
    heads = cfg.model.heads
    if heads is not None:
        errors.need(all(h in ("lm", "mlm", "rtd", "nsp") for h in heads)
                    and sum(h in heads for h in ("lm", "mlm", "rtd")) == 1 and not ("rtd" in heads and "nsp" in heads),
                    f"model.heads={heads} is not one LM head and optionally nsp; set it to [lm], [mlm] or either "
                    f"with nsp, or [rtd] (ELECTRA)")
    layers = cfg.model.attention_layers
    errors.need(layers is None or (layers and all(a in ATTENTIONS for a in layers)),
                f"model.attention_layers=[{', '.join(map(str, layers or []))}] is not a list of {' | '.join(ATTENTIONS)}; e.g. set "
                f"model.attention_layers=[global] (dense) or [global,local] (alternating)")
    betas = cfg.optimizer.betas
    errors.need(len(betas) == 2 and all(0 <= b < 1 for b in betas),
                f"optimizer.betas={betas} must be two values in [0, 1); e.g. set optimizer.betas=[0.9,0.999]")
    for i, pair in enumerate(cfg.train.skip_steps):
        errors.need(len(pair) == 2 and 1 <= pair[0] <= pair[1],
                    f"train.skip_steps[{i}]={pair} is not a [first, last] pair of steps (1 <= first <= last); "
                    f"write e.g. train.skip_steps=[[1201,1300]]")
    errors.need(dp >= 1, f"data-parallel size {dp} must be positive; launch at least parallel.tp processes")
    errors.need(cfg.data.paths and all(cfg.data.paths),
                "data.path is empty; set data.path=DIR (a dataset built by `ptm prep`) or a list of them")
    return errors


def _path_errors(cfg: Config) -> list[str]:
    """out_dir: a directory, or one that can be made; its checkpoint pointer a file."""
    errors = _Problems()
    if not cfg.out_dir.strip():
        errors.need(False, "out_dir is empty; set out_dir=DIR (a new directory, or a run's to resume it)")
        return errors
    errors.need(os.path.exists(cfg.out_dir) or not os.path.islink(cfg.out_dir),
                f"out_dir={cfg.out_dir} is a link to {os.readlink(cfg.out_dir) if os.path.islink(cfg.out_dir) else ''}"
                f", which does not exist; create that directory, or set out_dir elsewhere")
    errors.need(not os.path.exists(cfg.out_dir) or os.path.isdir(cfg.out_dir),
                f"out_dir={cfg.out_dir} is a file; set out_dir to a directory (a new one, or a run's to resume it)")
    if not os.path.lexists(cfg.out_dir):
        errors.need(*_creatable(cfg.out_dir))
    elif os.path.isdir(cfg.out_dir):
        read_only = os.statvfs(cfg.out_dir).f_flag & os.ST_RDONLY
        errors.need(os.access(cfg.out_dir, os.W_OK | os.X_OK), f"out_dir={cfg.out_dir} is not writable "
                    f"{'(a read-only file system)' if read_only else 'by this user'}; make it writable, or set "
                    "out_dir elsewhere")
    latest = os.path.join(cfg.out_dir, "checkpoints", "latest")
    errors.need(not os.path.lexists(latest) or os.path.isfile(latest),
                f"{latest} is not a file (the name of the checkpoint to resume, which ptm writes there); remove it")
    return errors


def _creatable(out_dir: str) -> tuple[bool, str]:
    """Whether `out_dir` can be made (its nearest existing ancestor is a directory this user may write; `ptm plan`
    validates every layout it ranks, so nothing is tried), and the line that says why not."""
    above = os.path.dirname(os.path.abspath(out_dir))
    while not os.path.lexists(above):
        above = os.path.dirname(above)
    why = "not a directory" if not os.path.isdir(above) else "not writable" if not os.access(
        above, os.W_OK | os.X_OK) else ""
    return not why, f"out_dir={out_dir} cannot be created: {above} is {why}; set out_dir under a writable directory"


def _relation_errors(cfg: Config, dp: int) -> list[str]:
    """Values that do not fit together: the core sections' relations, then the rules of the objective, of every
    plug-in's section and of every family."""
    m, d, t, o, tp = cfg.model, cfg.data, cfg.train, cfg.optimizer, cfg.parallel.tp
    errors = _Problems()
    errors.need(m.head_dim or m.hidden_size % m.num_heads == 0,
                f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads}; make it a "
                f"multiple of the heads, or set model.head_dim")
    split = ("model.hidden_size", "model.ffn_hidden_size", "model.num_heads") if families.get(m.arch).attends else ()
    for k in (*split, "model.vocab_pad_to"):  # (a model without heads, ELMo's, splits its softmax alone)
        errors.need(cfg.get(k) % tp == 0, f"{k}={cfg.get(k)} is not divisible by parallel.tp={tp}; "
                                          f"use a parallel.tp that divides it")
    per_step = dp if t.micro_batch_size == AUTO else t.micro_batch_size * dp  # auto picks a divisor of the rest
    errors.need(t.global_batch_size % per_step == 0,
                f"train.global_batch_size={t.global_batch_size} is not divisible by "
                + (f"the data-parallel size {dp}; " if t.micro_batch_size == AUTO else
                   f"train.micro_batch_size x data-parallel size = {t.micro_batch_size} x {dp} = {per_step}; ") +
                f"set train.global_batch_size to a multiple of {per_step}")
    ramp = t.batch_rampup
    errors.need(not ramp or len(ramp) == 3 and 0 < ramp[0] < t.global_batch_size and ramp[1] > 0 and ramp[2] > 0
                and (t.global_batch_size - ramp[0]) % ramp[1] == 0,
                f"train.batch_rampup={ramp} is not [START, INCREMENT, SAMPLES] with 0 < START < "
                f"train.global_batch_size={t.global_batch_size}, whole INCREMENTs between them and SAMPLES > 0; e.g. "
                f"[{t.global_batch_size // 8 or 1}, {t.global_batch_size // 8 or 1}, 100000]")
    errors.need(not ramp or len(ramp) != 3 or all(b % dp == 0 for b in ramp[:2]),
                f"train.batch_rampup={ramp}: every global batch of the ramp must be a whole number of samples per "
                f"data-parallel rank (data-parallel size {dp}); make START and INCREMENT multiples of {dp}")
    errors.need(not ramp or not objectives.Objective.streamed(cfg),
                "train.batch_rampup changes the global batch, which is the number of streams that data.streams and "
                "model.mem_len read along; remove train.batch_rampup")
    needed = positions_needed(m, d.seq_len)
    errors.need(needed <= m.max_position_embeddings,
                f"data.seq_len={d.seq_len} needs {needed} positions but model.max_position_embeddings="
                f"{m.max_position_embeddings}; lower data.seq_len or raise model.max_position_embeddings"
                + (f" (position 0 is row {'pad_token_id + 1' if m.positional.from_pad else 'model.position_offset'} "
                   f"= {needed - d.seq_len})" if needed > d.seq_len else ""))
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
    errors.need(m.norm_type != "rmsnorm" or m.norm == "pre",
                "model.norm_type=rmsnorm needs model.norm=pre (a post-LN block's residual kernel is LayerNorm's); set "
                "model.norm=pre or model.norm_type=layernorm")
    local, kinds = "local" in m.attention_layers, "[" + ", ".join(m.attention_layers) + "]"
    sdpa = " | ".join(name for name, p in POSITIONS.items() if not p.kernel)
    errors.need(not local or not m.positional.kernel and families.get(m.arch).attends,
                f"model.attention_layers={kinds} has local layers, which model.arch={m.arch} with "
                f"model.position_encoding={m.position_encoding} has no band for (local attention is SDPA's with a "
                f"mask: position_encoding {sdpa}); set model.attention_layers=[global]")
    errors.need(len(set(m.attention_layers)) == 1 or m.share_layers in ("none", "ffn"),
                f"model.share_layers={m.share_layers} shares one attention between layers that model.attention_layers="
                f"{kinds} makes different; set model.share_layers=none (or ffn), or one kind of attention")
    errors.need("lm" not in m.heads or embedding_width(m) == m.hidden_size,
                f"model.embedding_size={m.embedding_size} differs from model.hidden_size={m.hidden_size}, but the lm "
                f"head projects hidden states onto the word embeddings; use the mlm head or model.embedding_size=0")
    errors.need(o.warmup_steps < 1 or float(o.warmup_steps).is_integer(),
                f"optimizer.warmup_steps={o.warmup_steps} is neither whole steps nor a fraction below 1; round it")
    # (under a batch ramp the schedule counts whole batches: the run is the samples its steps read, in them)
    ramped = ramp and not any(line.startswith("train.batch_rampup") for line in errors)
    run = t.samples_before(t.steps) / t.global_batch_size if ramped else t.steps
    errors.need(o.warmup(run) <= run, f"optimizer.warmup_steps={o.warmup_steps} is longer than " + (
        f"the run: train.steps={t.steps} under train.batch_rampup read {run:,.2f} whole batches of "
        f"train.global_batch_size" if ramped else f"train.steps={t.steps}")
        + "; shorten the warmup (a fraction below 1 is one of the run, such as optimizer.warmup_steps=0.1)")
    errors.need(o.decay_steps < 1 or float(o.decay_steps).is_integer(),
                f"optimizer.decay_steps={o.decay_steps} is neither whole steps nor a fraction below 1; round it")
    errors.need(not o.decay_steps or o.decay_end(run) > o.warmup(run),
                f"optimizer.decay_steps={o.decay_steps} ends the decay at "
                + (f"{o.decay_end(run):g} whole batches" if ramped else f"step {o.decay_end(run)}")
                + f", not after the warmup's {o.warmup(run)}{' whole batches' if ramped else ' steps'}; make it longer "
                  "(0: decay until train.steps)")
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
    _objective_errors(cfg, errors.need)
    for refused, line in _unread(cfg):
        errors.need(not refused, line)
    objective = objectives.get(d.objective)
    if "data.similar_words" in objective.keys_read:  # (else the key is one not read: said once, above)
        masking.check(cfg, errors.need)
    objective.check(cfg, errors.need)
    bound = objective.configured(cfg)
    for section in objectives.sections():
        owners = [o.name for o in objectives.REGISTRY.values() if o.section is section]
        errors.need(not section.owned or objective.section is section or getattr(cfg, section.name) == section.schema()
                    or hasattr(cfg, "provenance"),  # (a loaded config's: `_unread`, by the layer that gave it)
                    f"the {section.name} section is set but data.objective={d.objective}; it configures "
                    f"{' and '.join(owners)}: remove it")
        if section.check:
            section.check(cfg, errors.need, bound)
    for family in families.REGISTRY.values():
        if family.check:
            family.check(cfg, errors.need, bound)
    return errors


def _objective_errors(cfg: Config, need) -> None:
    """What the objective's attributes ask of the model and the data."""
    o, m, d = objectives.get(cfg.data.objective), cfg.model, cfg.data
    attention = "causal" if o.causal else "bidirectional"
    need(m.causal == o.causal,
         f"data.objective={o.name} does not fit model.arch={m.arch} (model.causal={m.causal}); {o.name} trains a model "
         f"with {attention} attention: " + ", ".join(p.name for p in objectives.REGISTRY.values() if p.causal == m.causal)
         + f" fit model.arch={m.arch}")
    need(not o.pairs or m.type_vocab_size >= 2,
         f"data.objective={o.name} pairs two segments but model.type_vocab_size={m.type_vocab_size}; "
         f"set model.type_vocab_size=2")
    need(d.pack_documents or o.packs_documents,
         "data.pack_documents=false applies to data.objective=" + ", ".join(
             p.name for p in objectives.REGISTRY.values() if p.packs_documents) + f", not {o.name}; remove it")
    need(not d.streams or (o.recurrent and len(d.paths) == 1 and d.pack_documents),
         "data.streams=true reads windows along streams of one dataset's packed documents: it needs data.objective "
         + " or ".join(p.name for p in objectives.REGISTRY.values() if p.recurrent)
         + f" (not {o.name}), one data.path (not {len(d.paths)}) and data.pack_documents=true; or set "
         "data.streams=false")
    need(cfg.fused_lm_loss != "on" or o.one_lm_head,
         f"fused_lm_loss=on replaces the one LM head, and data.objective={o.name} has several heads; "
         "set fused_lm_loss=auto (on where it applies) or off")


def _choices(cfg: Config) -> list[tuple[str, dict, list, dict]]:
    """What decides whether the config reads the keys that only some values of another key read: (that key, {each of
    its values: the keys it reads}, the config's values: one, or each layer's attention, {a key not read: the value
    the config's choice acts as anyway}). An objective reads its own section (`Section.owned`) too; fp16 its loss
    scaling, bf16 grad_accum_dtype."""
    m, objective = cfg.model, objectives.get(cfg.data.objective)
    own = {name: (*o.keys_read, *(_keys(o.section.schema, o.section.name) if o.section and o.section.owned else ()))
           for name, o in objectives.REGISTRY.items()}
    by_precision = {"fp16": _keys(FP16Config, "fp16"), "bf16": ["grad_accum_dtype"], "fp32": []}
    return [("data.objective", own, [cfg.data.objective], objective.fixed),
            ("precision", by_precision, [cfg.precision], {}),
            ("model.position_encoding", {name: [f"model.{k}" for k in p.keys] for name, p in POSITIONS.items()},
             [m.position_encoding], {}),
            ("model.attention_layers", {name: [f"model.{k}" for k in keys] for name, keys in ATTENTIONS.items()},
             list(m.attention_layers), {})]


def _keys(schema_, name: str) -> list[str]:
    """The dotted keys of section `name` (of dataclass `schema_`), as a config file gives them."""
    return list(Y.dotted(dataclasses.asdict(schema_()), schema_, f"{name}."))


@functools.cache
def _defaults() -> Config:
    return Config()


def _file(path: str) -> str:
    """A layer as a message names it: a preset by its file name."""
    return os.path.basename(path) if os.path.dirname(path) == PRESETS_DIR else path


def _shown(value) -> str:
    return f"[{', '.join(map(str, value))}]" if isinstance(value, list) else str(value)


def _unread(cfg: Config) -> list[tuple[bool, str]]:
    """Each key the config gives that its choices (`_choices`) do not read: (refused, the line saying so). Refused
    where given at or after the layer that made the choice; given only by an earlier base or by a file written out
    whole, a note where its value is not the default. A config built in code, not loaded, says nothing of where its
    keys come from: none."""
    p = getattr(cfg, "provenance", None)
    if p is None:
        return []
    out = []
    for chooser, readers, chosen, fixed in _choices(cfg):
        read = {k for value in chosen for k in readers.get(value, ())}
        layer, name = p.chose(chooser), chooser.rpartition(".")[2]
        choice = f"{chooser}={_shown(cfg.get(chooser))}" + (
            f" (model.arch={cfg.model.arch}'s)" if chooser not in p.origin and name in FEATURES else "")
        for key in dict.fromkeys(k for keys in readers.values() for k in keys):
            if key in read or key not in p.origin or (key in fixed and cfg.get(key) == fixed[key]):
                continue  # (a value the choice acts as anyway says what happens: data.masking=knowledge with ernie)
            given, value = p.origin[key], cfg.get(key)
            if given >= layer and given not in p.whole:
                by = " | ".join(v for v, keys in readers.items() if key in keys)
                out.append((True, f"{key}={_shown(value)} is not read with {choice}, only with {name} {by}; "
                                  "remove it"))
            elif value != _defaults().get(key):
                whole = ", a config written out whole" if given in p.whole else ""
                chosen_in = f" (from {_file(p.layers[layer])})" if layer not in (-1, given) else ""
                out.append((False, f"{key}={_shown(value)} (from {_file(p.layers[given])}{whole}) is not read with "
                                   f"{choice}{chosen_in}: ignored"))
    return out
