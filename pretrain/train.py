"""The training loop, in parts: `resolve` (config + datasets + resume -> a final config, pretrain/resolve.py), the
model and the parallelize step (pretrain/engine.py), `train_step` (gradient accumulation, losses normalised over the
global batch), `evaluate`, `save` (pretrain/checkpoint.py) and the log (pretrain/runlog.py). The objective
(pretrain/objectives/) decides samples, heads and loss terms; nothing here names one.

    summary = train(load("configs/bert-tiny.yaml", ["train.steps=100"]))
"""
from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import time
import warnings

import torch
import torch.distributed as dist
import yaml

from pretrain import checkpoint as C
from pretrain.checkpoint_manager import resume_mismatches
from pretrain import cost, engine, families, hardware, heartbeat, losses, models, optim, signals
from pretrain import device as dev
from pretrain import kernels as K
from pretrain.config import Config, ConfigError
from pretrain.data.factory import build_sources
from pretrain.data.loader import end_workers, make_loader
from pretrain.data.packing import real_tokens
from pretrain.parallel import mcore
from pretrain.parallel.layout import loss_scale, measures_grad_norm, unapplied_loss_scale
from pretrain.resolve import resolve
from pretrain.runlog import RunLog, log

LAST_LOSSES = 10  # summary.json's train_loss: the mean training loss of the run's last steps, at most this many

PREEMPTED, NO_PROGRESS = signals.PREEMPTED, signals.NO_PROGRESS


class Stopped(Exception):
    """The ranks agreed to end on a stop signal: `code` is their exit status, `line` what rank 0 said of it."""

    code, says = 1, "pretrain: "

    @property
    def line(self) -> str:
        return self.says + str(self)


class Preempted(Stopped):
    """A stop signal reached a rank: every rank checkpointed at the same step boundary."""

    code = PREEMPTED


class NoProgress(Stopped):
    """A stop signal came before the run trained a step since it (re)started: a requeued job would stop at the
    same step again, forever (a time limit shorter than the stop signal's lead)."""

    code, says = NO_PROGRESS, "pretrain: error: "


class Trainer:
    """One process of a (possibly single-process) DeepSpeed run: `Trainer(cfg).fit()` on every rank."""

    def __init__(self, cfg: Config):
        self.run = resolve(cfg)
        self.cfg, self.objective = cfg, self.run.objective
        self._check_start()
        self._built: dict = {}  # phase index -> (train, valid) sources
        self._idle_names: dict = {}  # modules not trained -> the names of their parameters (`idle`)
        self._sources((self.run.meta or {}).get("step", 0))  # then the data: a dataset the objective cannot sample
        # (e.g. built without the sentences it needs) is refused before the model is built and DeepSpeed starts
        self.world, self.dp, self.dp_rank = self.run.world, mcore.dp_size(), mcore.dp_rank()
        self.rank0 = dist.get_rank() == 0
        self.device = dev.device()
        with dev.building():
            model = models.build(cfg.model, heads=functools.partial(self.objective.heads, cfg))
            # what checkpoints hold: the trained parameters (not a frozen distillation teacher's)
            self.params = C.param_info(((n, p) for n, p in model.named_parameters() if p.requires_grad),
                                       mcore.tp_size())
            if self.run.resume:
                self._load_resumed(model)
            elif self.run.init:
                self._init_from(model, self.run.init)
            else:
                self.objective.initialise(model)
            model.to(self.device)
            self.optimizer = optim.build(model, cfg.optimizer)
            self.scheduler = optim.Schedule.from_config(cfg.optimizer, cfg.train.steps, cfg.train).scheduler(
                self.optimizer)
            self.parallel = engine.build(cfg, model, self.optimizer, self.scheduler)
        self.engine, self.model = self.parallel.engine, model
        self.accumulation, self.micro = self.engine.gradient_accumulation_steps(), cfg.train.micro_batch_size
        self.flops_per_sample = cost.flops_per_sample(cfg)
        self.device_name = torch.cuda.get_device_name() if self.device.type == "cuda" else "cpu"
        # (left_out: steps of this run that train.skip_steps named; trained_samples: what this run's steps read)
        self.step = self.consumed = self.left_out = self.trained_samples = 0
        self._stop: bool | None = None  # whether a rank got a stop signal, agreed by the last step (`_agree`)
        # the last step's gradient norm (a device tensor or a number; None before the first step): DeepSpeed's, or
        # ptm's where DeepSpeed's step measures none (`_own_norm`), read with the next step's transfer (`_agree`)
        self._norm: torch.Tensor | float | None = None
        self._own_norm = not measures_grad_norm(self.engine)
        self._previous_norm: float | None = None
        self.resumed_from = None
        if self.run.resume:
            self._restore()

    # ---- checkpoints ---------------------------------------------------------------------------------

    def _check_start(self) -> None:
        """Refuse, before anything is built, a checkpoint to resume of another model config, tokenizer, objective or
        dataset, and a checkpoint.init_from of another tokenizer."""
        if self.run.resume:
            problems = resume_mismatches(self.run.resume, self.run.meta, self.cfg, self.run.identity)
            if problems:
                raise C.CheckpointError("\n".join(problems))
        elif self.run.init:
            theirs, mine = C.tokenizer_sha256(self.run.init), self.run.identity["tokenizer_sha256"]
            if theirs not in (None, mine):
                raise C.CheckpointError(f"checkpoint.init_from={self.run.init} has another tokenizer (sha256 "
                                        f"{theirs[:12]}) than data.path (sha256 {mine[:12]}); build the dataset with "
                                        f"--tokenizer {os.path.join(self.run.init, 'tokenizer')}")

    def _load_resumed(self, model) -> None:
        """Refuse a checkpoint whose parameters differ from this model's; else load its weights."""
        resume, meta = self.run.resume, self.run.meta
        if meta["params"] != self.params:
            odd = sorted(n for n in set(self.params) | set(meta["params"]) if self.params.get(n) != meta["params"].get(n))
            raise C.CheckpointError(f"{resume} does not fit this model (parameters {odd[:3]} differ); use its "
                                    "config.yaml or another out_dir")
        pieces = C.Pieces(resume)
        model.load_state_dict({n: pieces.shard("param", n, mcore.tp_rank(), mcore.tp_size()) for n in pieces.params},
                              strict=False)

    def _restore(self) -> None:
        meta = self.run.meta
        same = meta["tp"] == mcore.tp_size() and meta["dp"] == self.dp
        trainer = self.run.checkpoints.restore(self.run.resume, self.parallel, self.optimizer, self.scheduler,
                                               tp_rank=mcore.tp_rank(), tp=mcore.tp_size(), same_layout=same)
        self.step, self.consumed = trainer["step"], trainer["consumed"]
        self.objective.load_state(self.run.resume, self.device)  # e.g. a recurrent model's memory
        self.resumed_from = {"step": self.step, "samples": self.consumed, "checkpoint": self.run.resume}
        if not trainer.get("rng_restored"):
            mcore.seed_everything(self.cfg.seed + self.step)
            why = (f"the layout changed (tp {meta['tp']} -> {mcore.tp_size()}, dp {meta['dp']} -> {self.dp})"
                   if not same else "the checkpoint holds no random states (consolidate and reshard leave them out)")
            log(f"{why}: dropout streams re-seeded")
        log(f"resumed from step {self.step} (samples {self.consumed:,}) of {self.run.resume}, written by "
            f"tp={meta['tp']} dp={meta['dp']} zero={meta.get('zero_stage')}")
        was_skipped = _config_value(self.run.resume, "train", "skip_steps") or []
        late = [pair for pair in self.cfg.train.skip_steps if pair[0] <= self.step and pair not in was_skipped]
        if late:
            log(f"warning: train.skip_steps {late} start{'s' * (len(late) == 1)} at or before step {self.step}, the "
                "checkpoint resumed: the steps up to it were trained; to leave them out, stop and roll the run back "
                f"to a checkpoint before them (python -m checkpoints_tools rollback {self.cfg.out_dir} --step M)")
        was_ramp = _config_value(self.run.resume, "train", "batch_rampup") or []
        if was_ramp != self.cfg.train.batch_rampup:
            log(f"train.batch_rampup {was_ramp} -> {self.cfg.train.batch_rampup}: the batch follows the samples "
                f"read ({self.consumed:,}); the learning rate is this config's schedule's at step {self.step + 1}")
        was_batch = _config_value(self.run.resume, "train", "global_batch_size")
        if was_batch not in (None, self.cfg.train.global_batch_size) and self._sources(self.step)[1] is not None:
            log(f"train.global_batch_size {was_batch} -> {self.cfg.train.global_batch_size}: an evaluation reads the "
                "first eval_steps global batches of the held-out samples, so its valid_* metrics from here on measure "
                "other samples than before")
        now = self.scheduler.get_last_lr()[0]
        was = trainer["scheduler"].get("_last_lr", [now])[0]  # (torch's scheduler state; none: nothing to compare)
        if abs(was - now) > 1e-6 * max(abs(was), abs(now)):  # e.g. more train.steps: the schedule is this config's
            log(f"the learning rate of step {self.step + 1} is {now:.4g} by this config's schedule, {was:.4g} by the "
                "checkpoint's (train.steps or optimizer.* changed): training goes on at the new one")

    def _init_from(self, model, ckpt: str) -> None:
        """Weights from a checkpoint of a model of this shape (its tokenizer is the dataset's: `_check_start`). A
        head or module that only one side has (BERT's NSP head and pooler for UniLM, SpanBERT's SBO head, TinyBERT's
        `fit`) is left out or starts fresh, and named."""
        state = C.load_model_shard(ckpt, mcore.tp_rank(), self.cfg.parallel.tp,
                                   vocab_rows=self.cfg.model.padded_vocab)
        module = lambda name: name.split(".")[0]  # noqa: E731
        mine, theirs = {module(n) for n in self.params}, {module(n) for n in state}
        missing, unexpected = model.load_state_dict({n: t for n, t in state.items() if module(n) in mine}, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state") and k in self.params and module(k) in theirs]
        if unexpected or missing:
            raise C.CheckpointError(f"{ckpt} does not fit this model: missing {missing[:4]}, unexpected "
                                    f"{unexpected[:4]}; check the model section against the checkpoint's meta.json")
        left, new = sorted(theirs - mine), sorted(mine - theirs)
        log(f"initialised weights from {ckpt}" + (f"; left out its {', '.join(left)}" if left else "")
            + (f"; new, initialised: {', '.join(new)}" if new else ""))

    def save(self) -> str:
        heartbeat.progress(f"the checkpoint of step {self.step}", patient=True)  # writes may take long
        cfg, corpus = self.cfg, self.run.corpora[0]
        meta = {"model": cfg.model, "params": self.params, "tp": mcore.tp_size(), "dp": self.dp, "step": self.step,
                "extra": {"zero_stage": cfg.zero.stage, "precision": cfg.precision, "consumed_samples": self.consumed,
                          "nfkc": corpus.manifest["options"]["text"]["nfkc"], "run": self.run.identity}}
        return self.run.checkpoints.save(self.step, {"scheduler": self.scheduler.state_dict(), "step": self.step,
                                                     "consumed": self.consumed}, self.parallel, self.optimizer,
                                         tp_rank=mcore.tp_rank(), dp_rank=self.dp_rank, meta=meta,
                                         config_yaml=cfg.to_yaml(), tokenizer_dir=os.path.join(corpus.path, "tokenizer"),
                                         rank_files=self.objective.state_files())

    # ---- steps ---------------------------------------------------------------------------------------

    def _utilisation(self, samples_per_s: float) -> dict[str, float]:
        """Model TFLOP/s per device and, on a GPU with a known peak, MFU (docs/performance.md)."""
        per_device = self.flops_per_sample * samples_per_s / self.world
        utilisation = hardware.mfu(per_device, self.device_name, self.cfg.precision)
        return {"tflops": per_device / 1e12, **({"mfu": utilisation} if utilisation is not None else {})}

    def _to_device(self, batch: dict) -> dict:
        """A micro-batch on this rank's device."""
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def train_step(self, micro_batches) -> dict:
        """One optimizer step over `accumulation` micro-batches. Each loss term is divided by its element count
        in the whole global batch (all micro-batches of all data-parallel ranks, counted first), times what
        DeepSpeed divides by (accumulation steps, data-parallel ranks), so the gradient is the same for any
        split of the batch. A non-finite loss on any rank stops every rank before the optimizer runs (fp16
        gradient overflows are DeepSpeed's: the step is skipped).

        Host syncs (the CPU waiting for the device): none per micro-batch; per step, whatever the accumulation, one
        from ptm (`_agree`'s transfer before the optimizer runs, which also brings the previous step's gradient norm:
        `fit` logs a step's row when the next step has run) and DeepSpeed's own in its step (2 to 6 in fp32/bf16/fp16
        at ZeRO 0-3: docs/performance.md)."""
        self.engine.train()
        phase, step = self.objective.phase(self.step), self.step + 1
        lr = self.scheduler.get_last_lr()[0]  # this step's (the engine's step moves the scheduler on to the next's)
        size = self._accumulate()  # (the global batch)
        heartbeat.progress(f"step {step}: loading its micro-batches")
        batches = [self._to_device(next(micro_batches)) for _ in range(self.accumulation)]
        heartbeat.progress(f"step {step}: counting its loss elements over the data-parallel ranks")
        counts = losses.global_counts([self.objective.elements(b, phase) for b in batches], mcore.dp_group())
        tally, finite = losses.Tally(), torch.ones((), device=self.device)
        padding = sum((1 - real.float().mean().double() for real in map(real_tokens, batches) if real is not None),
                      torch.zeros((), dtype=torch.float64, device=self.device))
        scale = unapplied_loss_scale(self.engine)  # fp16 at ZeRO-0: DeepSpeed's backward does not scale the loss
        self.optimizer.idle = self.idle(self.step)
        for i, batch in enumerate(batches):
            heartbeat.progress(f"step {step}: micro-batch {i + 1} of {self.accumulation}")
            terms = self.objective.compute(self.engine, batch, phase, fused=self.parallel.fused_lm_loss)
            loss = losses.objective(terms, counts) * (self.accumulation * self.dp * scale)
            finite = finite * torch.isfinite(loss.detach()).float()
            tally.add(terms)
            self.engine.backward(loss)
            if i == self.accumulation - 1:
                heartbeat.progress(f"step {step}: its metrics and optimizer step")
                signals.pause("collective")  # (tests, with a rank: the others wait in `_agree`'s all-reduce)
                metrics = self._agree(tally, finite, padding)
                own = self.parallel.layout.grad_norm() if self._own_norm else None  # before the step clips
            self.engine.step()
        if self.engine.was_step_applied():  # (not an fp16 overflow)
            self.optimizer.rested()
        self.step += 1
        signals.trained_steps += 1
        self.consumed += size
        self.trained_samples += size
        norm = self.engine.get_global_grad_norm() if own is None else own  # read with the next step's transfer
        # on the device even where DeepSpeed computes it elsewhere (ZeRO-Offload: on the host)
        self._norm = norm.detach().to(self.device, torch.float64, copy=True) / scale if torch.is_tensor(norm) else (
            None if norm is None else float(norm) / scale)
        metrics["lr"] = lr
        metrics.update(self.objective.phase_metrics(self.step - 1))
        if self.cfg.precision == "fp16":
            metrics.update(loss_scale=loss_scale(self.engine.optimizer), skipped_steps=self.engine.skipped_steps)
        return metrics

    def idle(self, step: int) -> frozenset[str]:
        """The names of the parameters optimizer step `step` (from 0) does not train: of the modules its phase does not
        (`Objective.idle`) and those the model's config never does (`Family.idle`)."""
        family = families.get(self.cfg.model.arch)
        modules = self.objective.idle(self.objective.phase(step)) + (family.idle(self.cfg.model) if family.idle else ())
        if modules not in self._idle_names:
            self._idle_names[modules] = frozenset(n for n in self.parallel.layout.names
                                                  if any(n == m or n.startswith(m + ".") for m in modules))
        return self._idle_names[modules]

    def _agree(self, tally: losses.Tally, finite: torch.Tensor, padding: torch.Tensor) -> dict:
        """The step's metrics, from its one transfer to the host before the optimizer runs: the metric sums (reduced
        over the data-parallel ranks), whether every rank's loss is finite and whether any rank got a stop signal
        (over all ranks: `_stop_agreed` reads it) and this rank's padding, reduced on the device and moved together."""
        stop = torch.full((), float(bool(signals.received)), dtype=torch.float64, device=self.device)
        flags = dev.all_reduce(torch.stack([1 - finite.double(), stop]))
        sums = tally.sums(mcore.dp_group()).flatten()
        norm = self._norm if torch.is_tensor(self._norm) else torch.zeros((), dtype=torch.float64, device=self.device)
        *sums, nonfinite, stop, padding, norm = torch.cat([sums, flags, padding[None], norm[None]]).tolist()
        self._previous_norm = norm if torch.is_tensor(self._norm) else self._norm
        self._stop_unless_finite(nonfinite == 0)
        self._stop = stop > 0
        return {**tally.read(sums), "padding": padding / self.accumulation}

    def _stop_unless_finite(self, finite: bool) -> None:
        if not finite:
            end = self.consumed + self.cfg.train.batch_at(self.consumed) - 1
            raise FloatingPointError(f"the loss is not finite at step {self.step + 1} (samples {self.consumed:,} to "
                                     f"{end:,}); the weights were not updated: lower optimizer.lr or check these "
                                     "samples; to leave them out, "
                                     f"re-run with train.skip_steps={self._skips_with(self.step + 1)} (it resumes "
                                     "from the last checkpoint)")

    def _skips_with(self, step: int) -> str:
        """train.skip_steps with `step` added, as --set takes it (whole: a --set replaces the list)."""
        pairs = sorted([*map(list, self.cfg.train.skip_steps), [step, step]])
        return "[" + ",".join(f"[{a},{b}]" for a, b in pairs) + "]"

    def _sources(self, step: int):
        """(train, valid) sample sources of the objective's phase at `step` (e.g. ERNIE's stage: its tasks, its
        knowledge-masking level), built once per phase."""
        index = self.objective.phase_index(step)
        if index not in self._built:
            try:
                self._built[index] = build_sources(self.cfg, self.objective.phase(step), corpora=self.run.corpora)
            except ValueError as e:
                raise ConfigError(str(e)) from None
            samples, batch = len(self._built[index][0]), self.cfg.train.global_batch_size
            if batch > samples:  # (its micro-batches, all held before the step, would also fill the memory)
                raise ConfigError(f"train.global_batch_size={batch:,} is more than the {samples:,} samples of the "
                                  f"training split of data.path: one step would read samples twice; lower it, or "
                                  f"train on more data")
        return self._built[index]

    def _loader(self, source, start: int, workers: int, phase=None, end: int | None = None, micro: int | None = None):
        """Micro-batches of `source` from sample `start` (to `end`; None: endless) of `micro` samples (None:
        train.micro_batch_size), with the element indices of the loss terms of `phase` (None: the current step's),
        found on the host (`Objective.locate`)."""
        phase = self.objective.phase(self.step) if phase is None else phase
        return iter(make_loader(source, micro or self.cfg.train.micro_batch_size, rank=self.dp_rank, world_size=self.dp,
                                consumed_samples=start, total_samples=end, num_workers=workers,
                                unpadded=self.cfg.data.unpadded,
                                locate=functools.partial(self.objective.locate, phase=phase)))

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Metrics over the first `eval_steps` global batches of the held-out samples (at most as many as they fill),
        each rank its share in micro-batches (the same samples under any layout): global means (sums over every batch
        and rank, divided by the element counts), for the phase the last step was in."""
        self.engine.eval()
        step = max(self.step - 1, 0)
        _, valid = self._sources(step)
        if valid is None:
            return {}
        tally, phase = losses.Tally(), self.objective.phase(step)
        size = self.cfg.train.global_batch_size  # (no sample twice: at most the held-out set's whole batches)
        end = min(self.cfg.train.eval_steps, max(1, len(valid) // size)) * size
        for n, batch in enumerate(self._loader(valid, 0, 0, phase, end)):
            heartbeat.progress(f"the evaluation after step {self.step}: batch {n + 1}")
            batch = self._to_device(batch)
            signals.pause("evaluation")
            terms = self.objective.compute(self.engine, batch, phase)
            tally.add(terms, self.objective.baselines(batch, terms, self.run.most_frequent))
        means = tally.metrics(mcore.dp_group())
        means.update(self.objective.evaluation(means))
        means.update(self.objective.phase_metrics(step))
        return {f"valid_{k}": v for k, v in means.items()}

    def _log_row(self, out: RunLog, held: tuple | None, norm: float | None) -> None:
        """Log a step's row (step, metrics, shown) held back for its gradient norm (`norm`; None: none measured)."""
        if held is None:
            return
        step, metrics, show = held
        if norm is not None:
            metrics["grad_norm"] = norm
        out.step(step, metrics, show, self.objective.headline)

    def _read_norm(self) -> float | None:
        """The last step's gradient norm, read now (a host sync: for the last row before an evaluation, a checkpoint
        or the end, which sync anyway)."""
        return float(self._norm) if torch.is_tensor(self._norm) else self._norm

    def _stop_agreed(self) -> bool:
        """Whether any rank got a stop signal: all ranks learn it at the same step boundary, from the flag the last
        step agreed on (`_agree`), or by a collective of their own before a step."""
        if self._stop is not None:
            stop, self._stop = self._stop, None
            return stop
        flag = torch.full((1,), float(bool(signals.received)), device=self.device)
        return bool(dev.all_reduce(flag, op=dist.ReduceOp.MAX).item())

    def _ended(self, stop: Stopped) -> Stopped:
        """Every rank, having agreed to stop: rank 0 says why, each notes the exit status (`signals.note_end`), and
        they wait for each other before any ends: a launcher that kills the others as it sees the first exit then
        cuts neither the line nor the note."""
        if self.rank0:
            signals.end_line(stop.line, stop.code)
        else:
            signals.note_end(stop.code)
        dev.all_reduce(torch.zeros(1, device=self.device)).item()
        return stop

    def _no_progress(self) -> str:
        return signals.no_progress(signals.received, f"since resuming from step {self.step}" if self.run.resume
                                   else "of the run")

    def fit(self) -> dict:
        """Train to train.steps. SIGUSR1 or SIGTERM (a warning before the time limit, scancel, preemption) makes
        every rank finish its step, checkpoint there and raise Preempted."""
        previous, self.runlog, self.batches = signals.watch(), None, None
        try:
            return self._fit()
        finally:
            end_workers(self.batches)  # (an exception's traceback would keep them running: `end_workers`)
            signals.restore(previous)
            signals.training = False
            if self.runlog is not None:  # (whatever stopped the run: TensorBoard's files flushed and closed)
                self.runlog.close()

    def _fit(self) -> dict:
        cfg, first = self.cfg, self.step
        if self.run.resume and self.step >= cfg.train.steps:
            log(f"the checkpoint of step {self.step} ({self.run.resume}) is "
                f"{'past' if self.step > cfg.train.steps else 'at'} train.steps={cfg.train.steps}: nothing to train; "
                "raise train.steps to train on")
            recorded = [self._recorded() if self.rank0 else None]  # (rank 0's reading, for every rank: they
            dist.broadcast_object_list(recorded, src=0)  # go on together or not at all)
            if recorded[0] is not None:
                return recorded[0]  # (else the run ends as it would have: its evaluation, its summary)
        out = self.runlog = RunLog(cfg.out_dir, self.rank0, log)
        out.start(cfg.to_yaml(), {"device": self.device_name, "world_size": self.world, "tp": mcore.tp_size(),
                                  "dp": self.dp, "gpus_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", self.world)),
                                  "threads_per_rank": torch.get_num_threads(), "first_step": first,
                                  "cwd": os.getcwd()},  # (what a relative data.path is relative to)
                  cfg.train.steps, self.step)
        for line in cfg.ignored():  # keys a base of another objective or model gave, which this run does not read
            log(f"note: {line}")
        log("kernels: " + K.describe(cfg, self.parallel.kernels, self.parallel.fused_lm_loss, self.optimizer,
                                     self.device, self.objective.attention_mask))
        phase = self.objective.phase_index(self.step)
        micro = self.batches = self._next_loader()
        signals.pause("workers")  # (tests: the data-loader workers run)
        t0, last_eval, history, held = time.time(), {}, [], None
        recent = collections.deque(maxlen=LAST_LOSSES)  # the training loss of the last steps, for the summary
        signals.training = True  # a stop signal from here is acted on at a step boundary (before: SIGTERM ends it)
        if self._sources(self.step)[1] is None and cfg.train.eval_interval:
            log(f"note: data.valid_fraction=0 holds out nothing: train.eval_interval={cfg.train.eval_interval} "
                "evaluates nothing")
        while self.step < cfg.train.steps:
            heartbeat.progress(f"step {self.step + 1}: the stop-signal check")
            if self._stop_agreed():
                self._log_row(out, held, self._read_norm())
                out.close()
                if self.step == first:
                    raise self._ended(NoProgress(self._no_progress()))
                final = self.save()
                raise self._ended(Preempted(f"stopped by {signals.received or 'a signal to another rank'} at step "
                                            f"{self.step}: {final} written; exit {PREEMPTED}: requeue or resubmit the "
                                            "job to resume"))
            if self.objective.phase_index(self.step) != phase:  # e.g. ERNIE 2.0's next stage: its tasks join
                self._log_row(out, held, self._read_norm())  # the last step of the stage before, logged before it
                held = None
                phase = self.objective.phase_index(self.step)
                micro = self.batches = self._next_loader()
                log(f"step {self.step + 1}: stage {phase + 1}: "
                    + self.objective.describe(self.objective.phase(self.step)))
            if self.step == cfg.train.steps - 1:
                signals.pause("last")
            left_out = cfg.train.skipped(self.step + 1) is not None
            if left_out:
                self._log_row(out, held, self._read_norm())  # (the last trained step's row, before the line)
                held = None
                end_workers(micro)  # (the loader starts again where the steps left out end)
                micro = self.batches = None
                self._leave_out(out)
            else:
                if micro is not None and self._resize():  # (a batch ramp's: a loader of the new micro batch)
                    end_workers(micro)
                    micro = None
                if micro is None:
                    micro = self.batches = self._next_loader()
                start = time.time()
                try:
                    metrics = self.train_step(micro)
                except FloatingPointError:  # the last finite step's row is logged (with its norm) before the error
                    self._log_row(out, held, self._previous_norm)
                    raise
                dt = time.time() - start
                if self.step == first + 1 and self.parallel.kernels == "compile":
                    log(f"step {self.step} took {dt:.1f} s, torch.compile's compilation included")
                batch = self.accumulation * self.micro * self.dp  # (this step's: a batch ramp grows it)
                metrics.update(step_time_s=dt, samples_per_s=batch / dt, tokens_per_s=batch * cfg.data.seq_len / dt,
                               memory_gib=dev.peak_memory_gib(), **dev.device_memory(),
                               **self._utilisation(batch / dt))
                # a step's row waits for its gradient norm, which the next step's transfer brings
                self._log_row(out, held, self._previous_norm)
                recent.append(metrics["loss"])
                held = (self.step, metrics, bool(cfg.train.log_interval and self.step % cfg.train.log_interval == 0
                                                 or self.step == cfg.train.steps))  # (the last step's row is shown)
            # (none at a step left out: its weights are the last trained step's)
            evaluate = cfg.train.eval_interval and self.step % cfg.train.eval_interval == 0 and not left_out
            save = (cfg.checkpoint.interval and self.step % cfg.checkpoint.interval == 0 and self.step < cfg.train.steps
                    and not left_out)
            if evaluate or save or self.step == cfg.train.steps:
                self._log_row(out, held, self._read_norm())
                held = None
            if evaluate:
                last_eval = self.evaluate()
                history.append({"step": self.step, **last_eval})
                out.evaluation(self.step, last_eval)
            if save:
                self.save()
        final = self.save() if self.step != first or not self.run.resume else self.run.resume
        if not last_eval or history[-1]["step"] != self.step:
            last_eval = self.evaluate()
            if self.step != first:  # the run's last evaluation, in valid.jsonl and TensorBoard too
                out.evaluation(self.step, last_eval)
        out.close()
        elapsed, trained = time.time() - t0, self.step - first - self.left_out
        summary = {"steps": self.step, "trained_steps": trained, "resumed_from": self.resumed_from,
                   **({"steps_left_out": self.left_out} if self.left_out else {}),
                   "seconds": round(elapsed, 1),
                   "samples": self.consumed, "checkpoint": final,
                   **({"train_loss": round(sum(recent) / len(recent), 4)} if recent else {}),
                   **{k: round(v, 4) for k, v in last_eval.items()},
                   "tokens_per_s": round(self.trained_samples * cfg.data.seq_len / max(elapsed, 1e-9)),
                   **{k: round(v, 4) for k, v in self._utilisation(self.trained_samples
                                                                   / max(elapsed, 1e-9)).items()},
                   "skipped_steps": self.engine.skipped_steps, "peak_memory_gib": round(dev.peak_memory_gib(), 2),
                   **{k: round(v, 2) for k, v in dev.device_memory().items()},
                   "layout": {"tp": mcore.tp_size(), "dp": self.dp, "zero_stage": cfg.zero.stage,
                              "precision": cfg.precision}}
        if self.engine.skipped_steps:
            log(f"{self.engine.skipped_steps} of the run's {self.step} steps were skipped (fp16 loss scaling: their "
                "gradients overflowed): not applied, and the learning-rate schedule did not move for them (DeepSpeed's "
                "and Megatron's accounting); fewer come with a lower fp16.initial_scale_power")
        out.summary(summary)
        return summary

    def _resize(self) -> bool:
        """Whether the next step's micro batch differs from the last one's: train.micro_batch_size, or under a batch
        ramp the largest divisor of the step's per-rank batch up to it (the ramp's first batches may be smaller)."""
        share, micro = self.cfg.train.batch_at(self.consumed) // self.dp, self.cfg.train.micro_batch_size
        if share % micro:  # (only in a ramp's steps: every step of the whole batch takes the configured one at once)
            micro = max(b for b in range(1, min(share, micro) + 1) if share % b == 0)
        changed, self.micro = micro != self.micro, micro
        return changed

    def _accumulate(self) -> int:
        """The global batch of the next step (train.batch_rampup: growing with the samples read), DeepSpeed's micro
        batch and accumulation set to it: its boundary test counts micro-batches, so its count is made a whole number
        of steps of the new accumulation (as a resume under another layout does)."""
        batch = self.cfg.train.batch_at(self.consumed)
        self.accumulation, engine = batch // (self.micro * self.dp), self.engine
        if (self.accumulation, self.micro) != (engine.gradient_accumulation_steps(),
                                               engine.train_micro_batch_size_per_gpu()):
            engine.set_train_micro_batch_size(self.micro)
            engine.set_train_batch_size(batch)
            for holder in (engine.optimizer, getattr(engine.optimizer, "optimizer", None)):
                if hasattr(holder, "gradient_accumulation_steps"):  # (ZeRO's copy, kept in step)
                    holder.gradient_accumulation_steps = self.accumulation
            engine.micro_steps = engine.global_steps * self.accumulation
        return batch

    def _next_loader(self):
        """The micro-batches of the next step on, from the data position reached; None where that step is one
        train.skip_steps leaves out (the first step trained after it starts one)."""
        if self.cfg.train.skipped(self.step + 1):
            return None
        self._resize()
        return self._loader(self._sources(self.step)[0], self.consumed, self.cfg.data.num_workers, micro=self.micro)

    def _leave_out(self, out: RunLog) -> None:
        """Step `self.step + 1` is one train.skip_steps names: its global batch is not trained on (no forward, no
        update, no dropout drawn), the data position and the learning-rate schedule move on past it as if it were."""
        first, last = self.cfg.train.skipped(self.step + 1)
        if self.step + 1 == first or not self.left_out:  # (a range's first step, or where a resumed run is in one)
            upto, end = min(last, self.cfg.train.steps), self.consumed
            for _ in range(upto - self.step):
                end += self.cfg.train.batch_at(end)
            log(f"steps {self.step + 1}-{upto} left out (train.skip_steps): samples {self.consumed:,} to {end - 1:,} "
                "not trained on; the learning rate moves on")
        self.step += 1
        self.left_out += 1
        self.consumed += self.cfg.train.batch_at(self.consumed)
        with warnings.catch_warnings():  # (torch's, where no optimizer step came first: a run that skips its first)
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step\\(\\)` before")
            self.scheduler.step()
        out.left_out()

    def _recorded(self) -> dict | None:
        """The summary a finished run recorded at this step (its summary.json), which a re-run returns and writes
        nothing over (config.yaml, launch.json, the logs); None where there is none (a run killed after its last
        checkpoint, before its summary)."""
        with contextlib.suppress(OSError, ValueError), open(os.path.join(self.cfg.out_dir, "summary.json")) as f:
            recorded = json.load(f)
            if isinstance(recorded, dict) and recorded.get("steps") == self.step:
                return recorded
        return None

    def close(self) -> None:
        """Stop the heartbeat and release DeepSpeed's hooks and buffers (ZeRO-3 partitioning, offload), so that
        another Trainer in this process starts clean: ZeRO-3 also replaces torch.nn.functional.linear process-wide
        with its own (a matmul and a bias add; "this will persist unless manually reset"), which is put back."""
        heartbeat.stop()
        self.engine.destroy()
        from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses

        original = getattr(InsertPostInitMethodToModuleSubClasses, "linear_bk", None)
        if original is not None:
            torch.nn.functional.linear = original


def _config_value(ckpt: str, section: str, key: str):
    """A value of the config a checkpoint was written with (its config.yaml); None where it cannot be read."""
    with contextlib.suppress(OSError, yaml.YAMLError, AttributeError, TypeError), \
            open(os.path.join(ckpt, "config.yaml")) as f:
        return yaml.safe_load(f).get(section, {}).get(key)
    return None


def train(cfg: Config) -> dict:
    """Train (or resume) `cfg` in this process, then leave the process group."""
    try:
        trainer = Trainer(cfg)
        try:
            return trainer.fit()
        finally:
            trainer.close()
    finally:
        mcore.shutdown()
