"""What every pretraining objective plug-in provides (`pretrain/objectives/*.py` subclass `Objective`).

An objective owns all that training on it takes: its config section (if any), its checks, its schedule of phases,
its sample source and masker, the heads it adds to the model, its loss terms and metrics. The trainer, the data
factory, the engine and `ptm plan` ask it; none of them names an objective. Modules here import torch and the data
code inside the methods that run them, so the config and `ptm plan` load without them.

    objective = objectives.get(cfg.data.objective).configured(cfg)      # bound to a resolved config
    phase = objective.phase(step)                                        # e.g. ERNIE 2.0's stage at that step
    counts = losses.global_counts([objective.elements(b, phase) for b in batches], dp_group)
    loss = losses.objective(objective.compute(model, batch, phase), counts)
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

AT = "at:"  # the batch fields holding each term's element indices (`Objective.locate`)
M32 = 0xFFFFFFFF


def hash32(x):
    """A 32-bit integer hash (avalanching) of int64 tensors holding values below 2**32: draws that are functions of a
    sample alone (ELECTRA's sampling noise, UniLM's masks) and so the same under any layout."""
    x = (((x >> 16) ^ x) * 0x45D9F3B) & M32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & M32
    return (x >> 16) ^ x


@dataclasses.dataclass(frozen=True)
class Section:
    """A config section that a plug-in owns: `name` (the top-level key), its dataclass `schema`, and `check(cfg,
    need, objective)`, run for every config (a section may be set where it does not apply; `objective`: the config's
    objective, bound to it). `owned`: only the objectives that name it read it (a config setting it under another is
    refused); else its check says where it applies (ERNIE's stages: its knowledge masking too)."""

    name: str
    schema: type
    check: Callable | None = None
    owned: bool = True


class Objective:
    name = ""
    help = ""
    causal = False  # predicts each next token (a causal model) rather than masked tokens (a bidirectional one)
    pairs = False  # samples hold two segments: the model needs segment embeddings
    one_lm_head = True  # every prediction comes from the model's own LM head (fused_lm_loss can replace it)
    packs_documents = False  # reads data.pack_documents (documents concatenated into windows)
    reads = "tokens"  # the dataset it samples: tokens (`data_prep build`) or words (`data_prep words`)
    sentinels = False  # it needs T5's sentinels in the vocabulary (`data_prep build --sentinels`, `data_prep sentinels`)
    recurrent = False  # its samples can be read as streams that carry a model's memory (model.mem_len)
    attention_mask = "padding"  # the mask a bidirectional model attends under: [b, s] padding, or per-token spans
    section: Section | None = None  # its config section
    keys_read: tuple[str, ...] = ()  # the config keys it reads that not every objective reads (data.mask_prob, ...):
    # a key that some objective lists and the config's does not is refused where given beside data.objective, noted
    # as ignored where a base of another objective gave it (pretrain/config.py)
    fixed: dict = {}  # keys of `keys_read`'s kind that it does not read, {key: the value it acts as} (ERNIE's masking)
    headline = ()  # metrics the progress bar shows after `loss`
    cfg = None  # the config of a `configured` objective
    _recurrence = None

    def configured(self, cfg) -> "Objective":
        """This objective bound to a resolved config: its settings, schedule and data come from `cfg`."""
        bound = object.__new__(type(self))
        bound.__dict__.update(self.__dict__, cfg=cfg, _recurrence=None)
        return bound

    # ---- the config -----------------------------------------------------------------------------------------

    def check(self, cfg, need) -> None:
        """Record, by `need(ok, message)`, each way `cfg` does not fit this objective (message: one line with
        the fix). What every objective asks of a config (its attention direction, segments, one LM head) the config
        checks from the attributes above."""

    def predicted_tokens(self, data) -> int:
        """Tokens per sequence the LM head runs on (`data`: the config's data section)."""
        return data.max_predictions_per_seq or math.ceil(data.mask_prob * data.seq_len)

    def decoder_tokens(self, data) -> int:
        """Tokens per sequence an encoder-decoder's decoder runs on (0: the objective trains no decoder)."""
        return 0

    # ---- the schedule ---------------------------------------------------------------------------------------

    def phases(self) -> list:
        """The phases of training in order, each with its `steps` (e.g. ERNIE's stages); [] for one phase."""
        return []

    def phase_index(self, step: int) -> int:
        """Index of the phase that optimizer step `step` (from 0) belongs to (the last one after the schedule
        ends); 0 without phases."""
        return 0

    def phase(self, step: int):
        """What the objective trains on at optimizer step `step` (passed to `source`, `select`, `compute`); None
        without phases."""
        return None

    def describe(self, phase) -> str:
        """The log line's words for a phase that begins."""
        return str(phase)

    def idle(self, phase) -> tuple[str, ...]:
        """The model's modules (or parameters) that `phase` does not train, by name: no gradient reaches them, so the
        optimizer leaves them as they are (no weight decay) and counts their steps from their first, as torch does a
        parameter whose gradient is None; DeepSpeed would hand it zeros (ERNIE 2.0's heads of later stages)."""
        return ()

    def phase_metrics(self, step: int) -> dict[str, float]:
        """Metrics naming the phase of step `step` (`stage`, from 1), when there are several."""
        return {"stage": self.phase_index(step) + 1} if self.phases() else {}

    # ---- data and model -------------------------------------------------------------------------------------

    def source(self, path: str, corpus, docs, phase, cache_dir: str | None = None):
        """The sample source of `phase` over documents `docs` of the dataset `corpus` at `path`."""
        raise NotImplementedError

    def heads(self, cfg, frozen: bool = True) -> dict:
        """Heads beyond the model's own (`cfg.model.heads`), {attribute: module}: the model registers them. `frozen`:
        with those read from disk that do not train (a distillation's teacher)."""
        return {}

    def initialise(self, model) -> None:
        """Set a new model's weights before its first step (a run that neither resumes nor starts from
        checkpoint.init_from); DistilBERT's student takes its teacher's."""

    def head_parameters(self, cfg) -> int:
        """Parameters of `heads(cfg)`, counted without building them (pretrain/cost.py)."""
        return 0

    def teacher(self, cfg):
        """The ModelConfig of a frozen model run beside the trained one (a distillation's teacher), or None; raises
        FileNotFoundError where one is named but cannot be read here (`ptm plan` away from it)."""
        return None

    def kept_bytes(self, cfg, micro_batch: int) -> int:
        """Activation bytes per GPU that the loss keeps beyond the model's own (TinyBERT's traced layers)."""
        return 0

    @staticmethod
    def streamed(cfg) -> bool:
        """Whether `cfg`'s samples are read as streams of the global batch: the model carries a memory from step to
        step (model.mem_len > 0) or data.streams asks for that order."""
        return bool(cfg.model.mem_len or cfg.data.streams)

    def streams(self) -> int:
        """The streams the samples are read as (pretrain/data/gpt.py): the global batch where `streamed`, else 0
        (shuffled)."""
        return self.cfg.train.global_batch_size if self.streamed(self.cfg) else 0

    # ---- a recurrent model's memory (pretrain/models/recurrence.py) ------------------------------------------

    def recurrence(self):
        """The memories a recurrent model carries across steps, or None (model.mem_len 0)."""
        if self._recurrence is None and self.cfg is not None and self.cfg.model.mem_len:
            from pretrain.models.recurrence import Recurrence

            self._recurrence = Recurrence(self.streams(), self.cfg.model.mem_len)
        return self._recurrence

    def memory_inputs(self, model, batch: dict) -> dict:
        """The model's memory arguments for `batch` ({} without a memory)."""
        recurrence = self.recurrence()
        return recurrence.inputs(model, batch) if recurrence else {}

    def remember(self, model, batch: dict, out: dict) -> None:
        """Keep the model's next memory (its output `out`) for the streams of `batch`."""
        recurrence = self.recurrence()
        if recurrence:
            recurrence.update(model, batch, out)

    def state_files(self) -> dict:
        """This rank's training state beyond the model and optimizer, {checkpoint-relative path: {name: tensor}}
        (a recurrent model's memory)."""
        return self.recurrence().files() if self.recurrence() else {}

    def load_state(self, ckpt: str, device) -> None:
        """Restore what `state_files` wrote, from a checkpoint of any layout."""
        if self.recurrence():
            self.recurrence().load(ckpt, device)

    # ---- loss terms -----------------------------------------------------------------------------------------

    def select(self, batch: dict, phase=None) -> dict:
        """Each loss term's elements as a boolean mask over the batch (tokens [b, s] or sequences [b]), in a
        fixed order that is the same on every rank."""
        raise NotImplementedError

    def locate(self, batch: dict, phase=None) -> dict:
        """`batch` (on the host: the data loader's collate calls this) with the flat indices of each term's elements
        (`select`'s True positions) as `AT + name`, so that `compute` picks them on the device without a sync."""
        return {**batch, **{AT + name: mask.flatten().nonzero().squeeze(1)
                            for name, mask in self.select(batch, phase).items()}}

    def where(self, batch: dict, phase=None) -> dict:
        """Each term's elements for `losses.pick`: the indices `locate` put in the batch, else `select`'s masks (a
        device sync on a GPU for each mask picked with: the count is data)."""
        located = {k[len(AT):]: v for k, v in batch.items() if k.startswith(AT)}
        return located or self.select(batch, phase)

    def elements(self, batch: dict, phase=None) -> dict:
        """The number of elements of each term in a micro-batch, from its labels alone (no forward pass)."""
        return {name: mask.sum() for name, mask in self.select(batch, phase).items()}

    def compute(self, model, batch: dict, phase=None, fused: bool = False) -> dict:
        """The batch's loss terms ({name: losses.Term}, summed, not averaged); `fused`: the LM head runs the fused
        linear cross-entropy (the parallelize step's decision, for training; pretrain/engine.py)."""
        raise NotImplementedError

    def baselines(self, batch: dict, terms: dict, most_frequent: int) -> dict:
        """Evaluation metrics of trivial predictors, {name: (hits, count)} (e.g. always the most frequent token)."""
        return {}

    def evaluation(self, metrics: dict) -> dict:
        """Metrics derived from the evaluation's means (e.g. perplexity)."""
        return {}


SEQ2SEQ_INPUTS = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")


class Seq2Seq(Objective):
    """What the encoder-decoder objectives (span_corruption, denoising, mass) share: the checks, the inputs of both
    stacks, one term `lm` over the target tokens with a label (their flat indices found on the host: the LM head runs
    on them alone), its accuracy, perplexity, and the unigram guess as a baseline."""

    headline = ("lm_loss", "lm_acc")
    arch = ""  # the family whose presets train on it, for the fix in the check's message

    def check(self, cfg, need) -> None:
        super().check(cfg, need)
        m = cfg.model
        need(m.decoder_layers > 0, f"data.objective={self.name} trains an encoder-decoder but model.decoder_layers=0; "
                                   + (f"set model.arch={self.arch} (or model.decoder_layers)" if m.arch != self.arch
                                      else "set model.decoder_layers to 1 or more"))
        need(m.type_vocab_size == 0, f"model.type_vocab_size={m.type_vocab_size}: {self.name} samples have one "
                                     f"segment; set model.type_vocab_size=0")
        need(not cfg.data.unpadded, f"data.unpadded=true packs BERT and ERNIE samples, not {self.name}'s; remove it")

    def decoder_tokens(self, data) -> int:
        return data.seq_len  # the target (BART, MASS: aligned with the input, padded to seq_len)

    def select(self, batch, phase=None):
        return {"lm": batch["labels"] != -100}

    def compute(self, model, batch, phase=None, fused=False):
        import torch

        from pretrain.losses import fused_term, pick, token_term

        where = self.where(batch, phase)["lm"]
        target = pick(batch["labels"], where, 2)
        inputs = {k: batch[k] for k in SEQ2SEQ_INPUTS if k in batch}
        if fused:
            return {"lm": fused_term(model(**inputs, positions=where, labels=target)["lm_loss"], target)}
        logits = model(**inputs, positions=where)["logits"]
        term = token_term(logits, target)
        if not torch.is_grad_enabled():  # held-out evaluation
            term.ratios = self.held_out(logits, target)
        return {"lm": term}

    def held_out(self, logits, target) -> dict | None:
        """Metrics {name: (hits, count)} of the held-out evaluation from the target tokens' logits."""
        return None

    def baselines(self, batch, terms, most_frequent):
        """Always answering the most frequent token, on the target tokens."""
        return {"lm_unigram_acc": ((batch["labels"] == most_frequent).sum(), terms["lm"].count)}

    def evaluation(self, metrics):
        from pretrain.losses import perplexity

        return perplexity(metrics)
