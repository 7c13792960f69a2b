"""The training loop: data, model, optimizer and schedule from a Config; gradient accumulation and
clipping, periodic evaluation, TensorBoard, a progress bar, checkpoints and exact resume.

    summary = train(load("configs/bert-tiny.yaml", ["train.steps=100"]))
"""
from __future__ import annotations

import functools
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from data_prep.dataset import Corpus
from pretrain import checkpoint as C
from pretrain import device as dev
from pretrain import engine, heartbeat, losses, objectives, optim, plan, signals
from pretrain import kernels as K
from pretrain.config import Config, ConfigError
from pretrain.data.factory import build_sources
from pretrain.data.loader import make_loader
from pretrain.data.packing import real_tokens
from pretrain.models.model import Pretraining
from pretrain.parallel import mcore
from pretrain.parallel.layout import loss_scale, unapplied_loss_scale
from ptm.files import write_json, write_text


PREEMPTED = 75  # the exit status of a run stopped by a signal after checkpointing (EX_TEMPFAIL: requeue and resume)


NO_PROGRESS = 5  # the exit status of a run stopped before its first step: requeueing it would loop without progress


class Preempted(Exception):
    """A stop signal reached a rank: every rank checkpointed at the same step boundary."""


class NoProgress(Exception):
    """A stop signal came before the run trained a step since it (re)started: a requeued job would stop at the
    same step again, forever (a time limit shorter than the stop signal's lead)."""


def _log(msg: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"pretrain: {msg}", file=sys.stderr, flush=True)


def _datasets(cfg: Config) -> list[Corpus]:
    corpora = [Corpus(p) for p in cfg.data.paths]
    tokenizers = {c.manifest["tokenizer"]["sha256"] for c in corpora}
    if len(tokenizers) > 1:
        raise ConfigError(f"data.path datasets use different tokenizers ({', '.join(cfg.data.paths)}); "
                          "build them with one --tokenizer")
    vocab = corpora[0].vocab_size
    if cfg.model.vocab_size == 0:
        cfg.model.vocab_size = vocab
    elif cfg.model.vocab_size != vocab:
        raise ConfigError(f"model.vocab_size {cfg.model.vocab_size} does not match the dataset's tokenizer "
                          f"({vocab} ids in {cfg.data.paths[0]}); set model.vocab_size=0 to take the dataset's")
    pad = corpora[0].special_ids.get("pad")
    if cfg.model.position_encoding == "roberta" and cfg.model.pad_token_id != pad:
        if pad is None:
            raise ConfigError(f"model.position_encoding=roberta numbers positions from the padding id, and the tokenizer "
                              f"of {cfg.data.paths[0]} has none; build the dataset with one that has [PAD] or <pad>")
        if cfg.model.pad_token_id != -1:
            raise ConfigError(f"model.pad_token_id {cfg.model.pad_token_id} is not the dataset's padding id ({pad} in "
                              f"{cfg.data.paths[0]}); set model.pad_token_id=-1 to take the dataset's")
        cfg.model.pad_token_id = pad
    return corpora


class Trainer:
    """One process of a (possibly single-process) DeepSpeed run: `Trainer(cfg).fit()` on every rank."""

    def __init__(self, cfg: Config):
        world = mcore.launched_world_size()
        if world % cfg.parallel.tp:  # before any process group is built
            raise ConfigError(f"parallel.tp={cfg.parallel.tp} does not divide the {world} processes launched; launch "
                              f"a multiple of {cfg.parallel.tp} processes or set parallel.tp to a divisor of {world}")
        collective_timeout_s = heartbeat.collective_timeout_s(cfg.parallel)
        mcore.init_processes(cfg.parallel.timeout_s, collective_timeout_s)
        heartbeat.start(cfg.parallel)  # from here a rank gone silent ends every rank with one line
        self.checkpoints = C.Checkpoints(cfg.out_dir, cfg.checkpoint.keep, log=_log)
        self.resume = self.checkpoints.newest_complete()
        meta = C.read_meta(self.resume) if self.resume else None
        seed = (meta or {}).get("run", {}).get("seed", cfg.seed)
        if seed != cfg.seed:
            _log(f"seed {seed} from {self.resume} (the config says {cfg.seed}): a resumed run keeps its seed")
            cfg.seed = seed
        if cfg.checkpoint.init_from and not self.resume:
            init = C.resolve(cfg.checkpoint.init_from)
            taken = C.adopt_model_shape(cfg, init)
            if taken:
                _log(f"model sizes from {init}: " + ", ".join(f"{k}={getattr(cfg.model, k)}" for k in taken))
        cfg.validate(dp=world // cfg.parallel.tp)
        dev.check_precision(cfg.precision)
        dev.deterministic(cfg.train.deterministic)
        mcore.initialize(cfg.parallel.tp, cfg.seed, cfg.parallel.timeout_s, collective_timeout_s)
        self.world, self.dp, self.dp_rank = world, mcore.dp_size(), mcore.dp_rank()
        self.cfg = cfg
        self.rank0 = dist.get_rank() == 0
        self.device = dev.device()
        self.corpora = _datasets(cfg)
        cfg.validate(dp=self.dp)  # again, with the dataset's vocabulary and padding id
        self.identity = C.run_identity(cfg, self.corpora)
        sample = self.corpora[0].shards[0].values["input_ids"][:10_000_000]
        self.most_frequent = int(np.bincount(sample, minlength=cfg.model.vocab_size).argmax())
        self.objective = objectives.get(cfg.data.objective).configured(cfg)
        model = Pretraining(cfg.model)
        self.objective.add_heads(model, cfg)
        self.params = C.param_info(model.named_parameters(), mcore.tp_size())
        if self.resume:
            self._load_resumed(model, meta)
        elif cfg.checkpoint.init_from:
            self._init_from(model, init)
        model.to(self.device)
        self.optimizer = optim.build(model, cfg.optimizer)
        self.scheduler = optim.Schedule.from_config(cfg.optimizer, cfg.train.steps).scheduler(self.optimizer)
        self.engine = engine.build(cfg, model, self.optimizer, self.scheduler)
        self.model = model
        self.accumulation = self.engine.gradient_accumulation_steps()
        self.flops_per_sample = plan.model_flops_per_sample(cfg.model, cfg.data.seq_len, plan.predicted_tokens(cfg))
        self.device_name = torch.cuda.get_device_name() if self.device.type == "cuda" else "cpu"
        self.step = self.consumed = 0
        self._stop: bool | None = None  # whether a rank got a stop signal, agreed by the last step (`_agree`)
        self.resumed_from = None
        self._built: dict = {}  # stage index -> (train, valid) sources
        if self.resume:
            self._restore(meta)

    # ---- checkpoints ---------------------------------------------------------------------------------

    def _load_resumed(self, model, meta: dict) -> None:
        """Refuse a checkpoint of another model, tokenizer, objective or dataset; else load its weights."""
        problems = C.resume_mismatches(self.resume, meta, self.cfg, self.identity)
        if not problems and meta["params"] != self.params:
            odd = sorted(n for n in set(self.params) | set(meta["params"]) if self.params.get(n) != meta["params"].get(n))
            problems = [f"{self.resume} does not fit this model (parameters {odd[:3]} differ); use its config.yaml "
                        "or another out_dir"]
        if problems:
            raise C.CheckpointError("\n".join(problems))
        pieces = C.Pieces(self.resume)
        model.load_state_dict({n: pieces.shard("param", n, mcore.tp_rank(), mcore.tp_size()) for n in pieces.params},
                              strict=False)

    def _restore(self, meta: dict) -> None:
        same = meta["tp"] == mcore.tp_size() and meta["dp"] == self.dp
        trainer = self.checkpoints.restore(self.resume, self.engine, self.optimizer, self.scheduler,
                                           tp_rank=mcore.tp_rank(), tp=mcore.tp_size(), same_layout=same)
        self.step, self.consumed = trainer["step"], trainer["consumed"]
        self.resumed_from = {"step": self.step, "samples": self.consumed, "checkpoint": self.resume}
        if not trainer.get("rng_restored"):
            mcore.seed_everything(self.cfg.seed + self.step)
            _log(f"the layout changed (tp {meta['tp']} -> {mcore.tp_size()}, dp {meta['dp']} -> {self.dp}): "
                 "dropout streams re-seeded")
        _log(f"resumed from step {self.step} (samples {self.consumed:,}) of {self.resume}, written by "
             f"tp={meta['tp']} dp={meta['dp']} zero={meta.get('zero_stage')}")

    def _init_from(self, model, ckpt: str) -> None:
        """Weights from a checkpoint of a model of this shape, trained with the dataset's tokenizer."""
        theirs, mine = C.tokenizer_sha256(ckpt), self.identity["tokenizer_sha256"]
        if theirs not in (None, mine):
            raise C.CheckpointError(f"checkpoint.init_from={ckpt} has another tokenizer (sha256 {theirs[:12]}) than "
                                    f"data.path (sha256 {mine[:12]}); build the dataset with --tokenizer "
                                    f"{os.path.join(ckpt, 'tokenizer')}")
        state = C.load_model_shard(ckpt, mcore.tp_rank(), self.cfg.parallel.tp,
                                   vocab_rows=model.embeddings.word.weight.shape[0] * self.cfg.parallel.tp)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        if unexpected or missing:
            raise C.CheckpointError(f"{ckpt} does not fit this model: missing {missing[:4]}, unexpected "
                                    f"{unexpected[:4]}; check the model section against the checkpoint's meta.json")
        _log(f"initialised weights from {ckpt}")

    def save(self) -> str:
        cfg, corpus = self.cfg, self.corpora[0]
        meta = {"model": cfg.model, "params": self.params, "tp": mcore.tp_size(), "dp": self.dp, "step": self.step,
                "extra": {"zero_stage": cfg.zero.stage, "precision": cfg.precision, "consumed_samples": self.consumed,
                          "nfkc": corpus.manifest["options"]["text"]["nfkc"], "run": self.identity}}
        return self.checkpoints.save(self.step, {"scheduler": self.scheduler.state_dict(), "step": self.step,
                                                 "consumed": self.consumed}, self.engine, self.optimizer,
                                     tp_rank=mcore.tp_rank(), dp_rank=self.dp_rank, meta=meta,
                                     config_yaml=cfg.to_yaml(), tokenizer_dir=os.path.join(corpus.path, "tokenizer"))

    # ---- steps ---------------------------------------------------------------------------------------

    def _utilisation(self, samples_per_s: float) -> dict[str, float]:
        """Model TFLOP/s per device and, on a GPU with a known peak, MFU (docs/performance.md)."""
        per_device = self.flops_per_sample * samples_per_s / self.world
        utilisation = plan.mfu(per_device, self.device_name, self.cfg.precision)
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

        Host syncs (the CPU waiting for the device): none per micro-batch; per step, whatever the accumulation, two
        from ptm (`_agree`'s one transfer before the optimizer runs, then DeepSpeed's gradient norm where it computes
        one) and DeepSpeed's own in its step (2 to 6 in fp32/bf16/fp16 at ZeRO 0-3: docs/performance.md)."""
        self.engine.train()
        tasks = self._tasks(self.step)
        batches = [self._to_device(next(micro_batches)) for _ in range(self.accumulation)]
        counts = losses.global_counts([self.objective.elements(b, tasks) for b in batches], mcore.dp_group())
        tally, finite = losses.Tally(), torch.ones((), device=self.device)
        padding = sum((1 - real.float().mean().double() for real in map(real_tokens, batches) if real is not None),
                      torch.zeros((), dtype=torch.float64, device=self.device))
        scale = unapplied_loss_scale(self.engine)  # fp16 at ZeRO-0: DeepSpeed's backward does not scale the loss
        for i, batch in enumerate(batches):
            terms = self.objective.compute(self.engine, batch, tasks)
            loss = losses.objective(terms, counts) * (self.accumulation * self.dp * scale)
            finite = finite * torch.isfinite(loss.detach()).float()
            tally.add(terms)
            self.engine.backward(loss)
            if i == self.accumulation - 1:
                metrics = self._agree(tally, finite, padding)
            self.engine.step()
        self.step += 1
        self.consumed += self.cfg.train.global_batch_size
        norm = self.engine.get_global_grad_norm()
        if norm is not None:
            metrics["grad_norm"] = float(norm) / scale
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        if self.cfg.ernie.stages:
            metrics["stage"] = self.cfg.ernie.stage_index(self.step - 1) + 1
        if self.cfg.precision == "fp16":
            metrics.update(loss_scale=loss_scale(self.engine.optimizer), skipped_steps=self.engine.skipped_steps)
        return metrics

    def _agree(self, tally: losses.Tally, finite: torch.Tensor, padding: torch.Tensor) -> dict:
        """The step's metrics, from its one transfer to the host before the optimizer runs: the metric sums (reduced
        over the data-parallel ranks), whether every rank's loss is finite and whether any rank got a stop signal
        (over all ranks: `_stop_agreed` reads it) and this rank's padding, reduced on the device and moved together."""
        stop = torch.full((), float(bool(signals.received)), dtype=torch.float64, device=self.device)
        flags = dev.all_reduce(torch.stack([1 - finite.double(), stop]))
        sums = tally.sums(mcore.dp_group()).flatten()
        *sums, nonfinite, stop, padding = torch.cat([sums, flags, padding[None]]).tolist()
        self._stop_unless_finite(nonfinite == 0)
        self._stop = stop > 0
        return {**tally.read(sums), "padding": padding / self.accumulation}

    def _stop_unless_finite(self, finite: bool) -> None:
        if not finite:
            raise FloatingPointError(f"the loss is not finite at step {self.step} (samples {self.consumed:,} to "
                                     f"{self.consumed + self.cfg.train.global_batch_size - 1:,}); the weights were "
                                     "not updated: lower optimizer.lr or check these samples")

    def _tasks(self, step: int) -> tuple[str, ...]:
        """The ERNIE 2.0 tasks of the stage that `step` is in."""
        e = self.cfg.ernie
        return tuple(e.stage_at(step).tasks) if self.cfg.data.objective == "ernie" else ()

    def _sources(self, step: int):
        """(train, valid) sample sources, built once per ERNIE stage (the stage that `step` is in decides the
        tasks and the knowledge-masking level; without stages there is one)."""
        index = self.cfg.ernie.stage_index(step)
        if index not in self._built:
            self._built[index] = self._build_sources(index)
        return self._built[index]

    def _build_sources(self, index: int):
        stage = self.cfg.ernie.stages[index] if self.cfg.ernie.stages else None
        try:
            return build_sources(self.cfg.data, self.cfg.seed, tasks=stage.tasks if stage else None,
                                 knowledge_level=stage.knowledge_level if stage else "entity",
                                 task_data=self.cfg.ernie.task_data)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def _loader(self, source, start: int, workers: int, tasks=None):
        """Micro-batches of `source` from sample `start`, with the element indices of the loss terms of `tasks` (None:
        those of the current step's stage), found on the host (`Objective.locate`)."""
        tasks = self._tasks(self.step) if tasks is None else tasks
        return iter(make_loader(source, self.cfg.train.micro_batch_size, rank=self.dp_rank, world_size=self.dp,
                                consumed_samples=start, num_workers=workers, unpadded=self.cfg.data.unpadded,
                                locate=functools.partial(self.objective.locate, tasks=tasks)))

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Metrics over `eval_steps` validation batches on every data-parallel rank: global means (sums over
        every batch and rank, divided by the element counts), for the tasks of the stage the last step was in."""
        self.engine.eval()
        step = max(self.step - 1, 0)
        _, valid = self._sources(step)
        if valid is None:
            return {}
        tally, tasks = losses.Tally(), self._tasks(step)
        for n, batch in enumerate(self._loader(valid, 0, 0, tasks)):
            if n == self.cfg.train.eval_steps:
                break
            batch = self._to_device(batch)
            terms = self.objective.compute(self.engine, batch, tasks)
            baseline = {}
            if "mlm" in terms and terms["mlm"].correct is not None:  # always answering the most frequent token
                baseline["mlm_unigram_acc"] = ((batch["labels"] == self.most_frequent).sum(), terms["mlm"].count)
            tally.add(terms, baseline)
        out = {f"valid_{k}": v for k, v in tally.metrics(mcore.dp_group()).items()}
        if "valid_lm_loss" in out:
            out["valid_ppl"] = math.exp(min(out["valid_lm_loss"], 50))
        if self.cfg.ernie.stages:
            out["valid_stage"] = self.cfg.ernie.stage_index(step) + 1
        return out

    def _stop_agreed(self) -> bool:
        """Whether any rank got a stop signal: all ranks learn it at the same step boundary, from the flag the last
        step agreed on (`_agree`), or by a collective of their own before a step."""
        if self._stop is not None:
            stop, self._stop = self._stop, None
            return stop
        flag = torch.full((1,), float(bool(signals.received)), device=self.device)
        return bool(dev.all_reduce(flag, op=dist.ReduceOp.MAX).item())

    def _no_progress(self) -> str:
        since = f"since resuming from step {self.step}" if self.resume else "of the run"
        limit = signals.slurm_time_limit()
        return (f"stopped by {signals.received or 'a signal to another rank'} before the first step {since}: a requeue "
                f"would stop here again, so the job ends (exit {NO_PROGRESS}, not requeued); "
                + (f"its time limit ({limit}) is" if limit else "a time limit") + " shorter than the stop signal's lead "
                "plus start-up: raise --time, or lower the lead (--signal=USR1@LEAD; slurm/pretrain.sbatch sets 300 s)")

    def fit(self) -> dict:
        """Train to train.steps. SIGUSR1 or SIGTERM (a warning before the time limit, scancel, preemption) makes
        every rank finish its step, checkpoint there and raise Preempted."""
        previous = signals.watch()
        try:
            return self._fit()
        finally:
            signals.restore(previous)

    def _fit(self) -> dict:
        cfg = self.cfg
        os.makedirs(cfg.out_dir, exist_ok=True)
        if self.rank0:
            write_text(os.path.join(cfg.out_dir, "config.yaml"), cfg.to_yaml())
            write_json(os.path.join(cfg.out_dir, "launch.json"),  # what `ptm plan --check` predicts for
                       {"device": self.device_name, "world_size": self.world, "tp": mcore.tp_size(), "dp": self.dp,
                        "gpus_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", self.world))})
        writer = _tensorboard(cfg.out_dir) if self.rank0 else None
        _log("kernels: " + K.describe(cfg, self.engine.kernels, self.engine.fused_lm_loss, self.optimizer, self.device))
        stage = cfg.ernie.stage_index(self.step)
        micro = self._loader(self._sources(self.step)[0], self.consumed, cfg.data.num_workers)
        tokens_per_step = cfg.train.global_batch_size * cfg.data.seq_len
        bar = _bar(cfg.train.steps, self.step) if self.rank0 else None
        t0, first, last_eval, history = time.time(), self.step, {}, []
        while self.step < cfg.train.steps:
            if self._stop_agreed():
                for done in (bar, writer):
                    if done is not None:
                        done.close()
                if self.step == first:
                    raise NoProgress(self._no_progress())
                final = self.save()
                raise Preempted(f"stopped by {signals.received or 'a signal to another rank'} at step {self.step}: "
                                f"{final} written; exit {PREEMPTED}: requeue or resubmit the job to resume")
            if cfg.ernie.stage_index(self.step) != stage:  # ERNIE 2.0: the next stage's tasks join
                stage = cfg.ernie.stage_index(self.step)
                micro = self._loader(self._sources(self.step)[0], self.consumed, cfg.data.num_workers)
                now = cfg.ernie.stages[stage]
                _log(f"step {self.step}: ERNIE stage {stage + 1}: " + (f"tasks {now.tasks}" if cfg.data.objective ==
                                                                      "ernie" else f"{now.knowledge_level}-level masking"))
            start = time.time()
            metrics = self.train_step(micro)
            dt = time.time() - start
            if self.step == first + 1 and self.engine.kernels == "compile":
                _log(f"step {self.step} took {dt:.1f} s, torch.compile's compilation included")
            metrics.update(step_time_s=dt, samples_per_s=cfg.train.global_batch_size / dt, tokens_per_s=tokens_per_step / dt,
                           memory_gib=dev.peak_memory_gib(), **dev.device_memory(),
                           **self._utilisation(cfg.train.global_batch_size / dt))
            if writer:
                for k, v in metrics.items():
                    writer.add_scalar(f"train/{k}", v, self.step)
                _append_jsonl(os.path.join(cfg.out_dir, "metrics.jsonl"), {"step": self.step, **metrics})
            if cfg.train.log_interval and self.step % cfg.train.log_interval == 0:
                (bar.write if bar is not None else _log)(f"step {self.step}: " + _fmt(metrics, tuple(metrics)))
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(_fmt(metrics, ("mlm_loss", "mlm_acc", "nsp_acc", "rtd_auc", "lm_loss", "lr",
                                                      "samples_per_s", "tokens_per_s")),
                                    refresh=False)
            if cfg.train.eval_interval and self.step % cfg.train.eval_interval == 0:
                last_eval = self.evaluate()
                history.append({"step": self.step, **last_eval})
                if writer:
                    for k, v in last_eval.items():
                        writer.add_scalar(f"valid/{k[6:]}", v, self.step)
                    _append_jsonl(os.path.join(cfg.out_dir, "valid.jsonl"), history[-1])
                _log(f"step {self.step}: " + _fmt(last_eval, tuple(last_eval)))
            if cfg.checkpoint.interval and self.step % cfg.checkpoint.interval == 0 and self.step < cfg.train.steps:
                self.save()
        if bar is not None:
            bar.close()
        final = self.save() if self.step != first or not self.resume else self.resume
        if not last_eval or history[-1]["step"] != self.step:
            last_eval = self.evaluate()
        elapsed = time.time() - t0
        summary = {"steps": self.step, "trained_steps": self.step - first, "resumed_from": self.resumed_from,
                   "seconds": round(elapsed, 1),
                   "samples": self.consumed, "checkpoint": final, **{k: round(v, 4) for k, v in last_eval.items()},
                   "tokens_per_s": round((self.step - first) * tokens_per_step / max(elapsed, 1e-9)),
                   **{k: round(v, 4) for k, v in self._utilisation((self.step - first) * cfg.train.global_batch_size
                                                                   / max(elapsed, 1e-9)).items()},
                   "skipped_steps": self.engine.skipped_steps, "peak_memory_gib": round(dev.peak_memory_gib(), 2),
                   **{k: round(v, 2) for k, v in dev.device_memory().items()},
                   "layout": {"tp": mcore.tp_size(), "dp": self.dp, "zero_stage": cfg.zero.stage,
                              "precision": cfg.precision}}
        if writer:
            writer.close()
        if self.rank0:
            write_json(os.path.join(cfg.out_dir, "summary.json"), summary)
        return summary

    def close(self) -> None:
        """Stop the heartbeat and release DeepSpeed's hooks and buffers (ZeRO-3 partitioning, offload), so that
        another Trainer in this process starts clean."""
        heartbeat.stop()
        self.engine.destroy()


def _append_jsonl(path: str, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def _fmt(metrics: dict, keys: tuple) -> str:
    return " ".join(f"{k}={metrics[k]:.4g}" for k in keys if k in metrics)


def _bar(total: int, done: int):
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc="train", unit="step", file=sys.stderr, dynamic_ncols=True,
                disable=None)


def _tensorboard(out_dir: str):
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(os.path.join(out_dir, "tensorboard"))


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
