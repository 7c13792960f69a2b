"""The training loop: data, model, optimizer and schedule from a Config; gradient accumulation and
clipping, periodic evaluation, TensorBoard, a progress bar, checkpoints and exact resume.

    summary = train(load("configs/bert-tiny.yaml", ["train.steps=100"]))
"""
from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from data_prep.dataset import Corpus
from pretrain import checkpoint as C
from pretrain import device as dev
from pretrain import engine, losses, optim, plan
from pretrain.config import Config, ConfigError
from pretrain.data.factory import build_sources
from pretrain.data.loader import make_loader
from pretrain.models.ernie_heads import ErnieTaskHeads
from pretrain.models.model import Pretraining
from pretrain.parallel import mcore
from ptm.files import write_text

ENGINE_COUNTERS = ("global_steps", "global_samples", "skipped_steps", "micro_steps")  # DeepSpeed's own


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
    return corpora


def _mean_over(metrics: dict[str, float], group) -> dict[str, float]:
    """Each metric averaged over the ranks of `group` that have it (ERNIE tasks may be missing from a batch)."""
    if dist.get_world_size(group) == 1:
        return metrics
    every = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, metrics, group=group)
    keys = sorted({k for m in every for k in m})
    return {k: sum(m[k] for m in every if k in m) / sum(k in m for m in every) for k in keys}


class _Resume:
    """A checkpoint being resumed: its pieces and this process's TP position."""

    def __init__(self, ckpt: str, pieces: C.Pieces, tp_rank: int, tp: int):
        self.ckpt, self.pieces, self.tp_rank, self.tp = ckpt, pieces, tp_rank, tp

    def shard(self, kind: str, name: str) -> torch.Tensor:
        return self.pieces.shard(kind, name, self.tp_rank, self.tp)

    def shards(self, kind: str) -> dict[str, torch.Tensor]:
        return {name: self.shard(kind, name) for name in self.pieces.params}


class Trainer:
    """One process of a (possibly single-process) DeepSpeed run: `Trainer(cfg).fit()` on every rank."""

    def __init__(self, cfg: Config):
        mcore.initialize(cfg.parallel.tp, cfg.seed)
        self.world, self.dp, self.dp_rank = dist.get_world_size(), mcore.dp_size(), mcore.dp_rank()
        cfg.validate(dp=self.dp)
        self.cfg = cfg
        self.rank0 = dist.get_rank() == 0
        self.device = dev.device()
        self.corpora = _datasets(cfg)
        sample = self.corpora[0].shards[0].values["input_ids"][:10_000_000]
        self.most_frequent = int(np.bincount(sample, minlength=cfg.model.vocab_size).argmax())
        model = Pretraining(cfg.model)
        if cfg.data.objective == "ernie":
            labelled = {task: Corpus(path).manifest["num_labels"] for task, path in cfg.ernie.task_data.items()}
            model.tasks = ErnieTaskHeads(cfg.model.hidden_size, cfg.model.init_std, labelled)
        self.shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        resume = self._checkpoint_to_resume()
        if resume:
            model.load_state_dict(resume.shards("param"), strict=False)
        elif cfg.checkpoint.init_from:
            self._init_from(model, cfg.checkpoint.init_from)
        model.to(self.device)
        self.optimizer = optim.build(model, cfg.optimizer)
        self.scheduler = optim.Schedule.from_config(cfg.optimizer, cfg.train.steps).scheduler(self.optimizer)
        self.engine = engine.build(cfg, model, self.optimizer, self.scheduler)
        self.model = model
        self.accumulation = self.engine.gradient_accumulation_steps()
        self.flops_per_sample = plan.model_flops_per_sample(cfg.model, cfg.data.seq_len, plan.predicted_tokens(cfg))
        self.device_name = torch.cuda.get_device_name() if self.device.type == "cuda" else "cpu"
        self.step = self.consumed = 0
        self._built: dict = {}  # stage index -> (train, valid) sources
        if resume:
            self._restore(resume)

    # ---- checkpoints ---------------------------------------------------------------------------------

    def _checkpoint_to_resume(self) -> _Resume | None:
        try:
            ckpt = C.resolve(self.cfg.out_dir)
        except C.CheckpointError:
            return None
        pieces = C.Pieces(ckpt)
        if C.model_config(pieces.meta) != self.cfg.model:
            raise C.CheckpointError(f"{ckpt} holds a different model than the config's model section; use "
                                    "the checkpoint's config.yaml or another out_dir")
        mine = C.param_info(self.shapes, mcore.tp_size())
        odd = sorted(n for n in set(mine) | set(pieces.params) if mine.get(n) != pieces.params.get(n))
        if odd:
            raise C.CheckpointError(f"{ckpt} does not fit this model (parameters {odd[:3]} differ); use its config.yaml "
                                    "or another out_dir")
        return _Resume(ckpt, pieces, mcore.tp_rank(), mcore.tp_size())

    def _restore(self, resume: _Resume) -> None:
        """Optimizer pieces, schedule, loss scale, counters and RNG from a checkpoint written by any layout;
        the weights were loaded into the model before DeepSpeed copied them."""
        path = os.path.join(resume.ckpt, "trainer.pt")
        if not os.path.isfile(path):
            raise C.CheckpointError(f"{resume.ckpt} holds weights only (no trainer.pt) and cannot be resumed; start "
                                    "a new out_dir with checkpoint.init_from pointing at it")
        meta, trainer = resume.pieces.meta, torch.load(path, weights_only=False)
        kinds = [k for k in C.KINDS if resume.pieces.has(k)]
        layout, state = self.engine.layout, self.optimizer.state
        places: dict[str, list] = {}
        for master, segments in layout.tensors:
            if "exp_avg" in kinds and not state[master]:
                state[master].update(step=trainer["optimizer_steps"], exp_avg=torch.zeros_like(master),
                                     exp_avg_sq=torch.zeros_like(master))
            for s in segments:
                places.setdefault(s.name, []).append((master, s))
        with torch.no_grad():
            for name, where in places.items():
                for kind in kinds:
                    src = resume.shard(kind, name).reshape(-1)
                    for master, s in where:
                        dst = master if kind == "param" else state[master][kind]
                        dst.view(-1)[s.offset:s.offset + s.length].copy_(src[s.start:s.start + s.length])
        self.scheduler.load_state_dict(trainer["scheduler"])
        for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = lr
        scaler = getattr(self.engine.optimizer, "loss_scaler", None)
        for k, v in (trainer["loss_scaler"] if scaler is not None else {}).items():
            setattr(scaler, k, v)
        for k, v in trainer["engine"].items():
            setattr(self.engine, k, v)
        self.step, self.consumed = trainer["step"], trainer["consumed"]
        same = meta["tp"] == mcore.tp_size() and meta["dp"] == self.dp
        rng = os.path.join(resume.ckpt, "rng", f"rank{dist.get_rank():05d}.pt")
        if same and os.path.isfile(rng):
            rng = torch.load(rng, weights_only=False)
            dev.set_rng_state(rng["torch"])
            np.random.set_state(rng["numpy"])
            random.setstate(rng["python"])
            mcore.rng_tracker().set_states(rng["tracker"])
        else:
            mcore.seed_everything(self.cfg.seed + self.step)
            _log(f"the layout changed (tp {meta['tp']} -> {mcore.tp_size()}, dp {meta['dp']} -> {self.dp}): "
                 "dropout streams re-seeded")
        _log(f"resumed from {resume.ckpt} at step {self.step} ({self.consumed:,} samples consumed; written by "
             f"tp={meta['tp']} dp={meta['dp']} zero={meta['zero_stage']})")

    def _init_from(self, model, path: str) -> None:
        ckpt = C.resolve(path)
        state = C.load_model_shard(ckpt, mcore.tp_rank(), self.cfg.parallel.tp,
                                   vocab_rows=model.embeddings.word.weight.shape[0] * self.cfg.parallel.tp)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        if unexpected or missing:
            raise C.CheckpointError(f"{ckpt} does not fit this model: missing {missing[:4]}, unexpected "
                                    f"{unexpected[:4]}; check the model section against the checkpoint's meta.json")
        _log(f"initialised weights from {ckpt}")

    def save(self) -> str:
        """Write step_N: each process its own pieces (no gathering), rank 0 the rest; renamed into place when
        complete, then `latest` is pointed at it."""
        cfg = self.cfg
        name = f"step_{self.step:08d}"
        root = os.path.join(cfg.out_dir, "checkpoints")
        final, tmp = os.path.join(root, name), os.path.join(root, f".{name}.tmp")
        if self.rank0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(os.path.join(tmp, "rng"))
        dist.barrier()
        layout, state = self.engine.layout, self.optimizer.state
        if layout.owner:
            for kind in C.KINDS:
                pieces = {f"{s.name}@{s.start}": (master if kind == "param" else state[master][kind]
                                                  ).reshape(-1)[s.offset:s.offset + s.length]
                          for master, segments in layout.tensors if kind == "param" or state[master]
                          for s in segments}
                if pieces:
                    C.write_pieces(tmp, kind, mcore.tp_rank(), self.dp_rank if layout.partitioned else 0, pieces)
        torch.save({"torch": dev.rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                    "tracker": mcore.rng_tracker().get_states()},
                   os.path.join(tmp, "rng", f"rank{dist.get_rank():05d}.pt"))
        dist.barrier()
        if self.rank0:
            self._save_rank0(tmp)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)  # complete checkpoints only ever appear under their final name
            C.mark_latest(cfg.out_dir, name)
            self._prune(root)
        dist.barrier()
        return final

    def _save_rank0(self, tmp: str) -> None:
        cfg, corpus = self.cfg, self.corpora[0]
        scaler = getattr(self.engine.optimizer, "loss_scaler", None)
        steps = [s["step"] for s in self.optimizer.state.values() if s]
        torch.save({"scheduler": self.scheduler.state_dict(), "step": self.step, "consumed": self.consumed,
                    "optimizer_steps": steps[0] if steps else 0,
                    "loss_scaler": {k: v for k, v in vars(scaler).items() if isinstance(v, (bool, int, float))}
                    if scaler is not None else {},
                    "engine": {k: getattr(self.engine, k) for k in ENGINE_COUNTERS}},
                   os.path.join(tmp, "trainer.pt"))
        C.copy_tokenizer(os.path.join(corpus.path, "tokenizer"), tmp)
        write_text(os.path.join(tmp, "config.yaml"), cfg.to_yaml())
        C.write_meta(tmp, model=cfg.model, params=C.param_info(self.shapes, mcore.tp_size()), tp=mcore.tp_size(),
                     dp=self.dp, step=self.step,
                     extra={"zero_stage": cfg.zero.stage, "precision": cfg.precision, "consumed_samples": self.consumed,
                            "nfkc": corpus.manifest["options"]["text"]["nfkc"]})

    def _prune(self, root: str) -> None:
        keep = self.cfg.checkpoint.keep
        steps = sorted(d for d in os.listdir(root) if d.startswith("step_"))
        for old in steps[:-keep] if keep else []:
            shutil.rmtree(os.path.join(root, old), ignore_errors=True)

    # ---- steps ---------------------------------------------------------------------------------------

    def _utilisation(self, samples_per_s: float) -> dict[str, float]:
        """Model TFLOP/s per device and, on a GPU with a known peak, MFU (docs/performance.md)."""
        per_device = self.flops_per_sample * samples_per_s / self.world
        utilisation = plan.mfu(per_device, self.device_name, self.cfg.precision)
        return {"tflops": per_device / 1e12, **({"mfu": utilisation} if utilisation is not None else {})}

    def _to_device(self, batch: dict) -> dict:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def train_step(self, micro_batches) -> dict:
        """One optimizer step over `accumulation` micro-batches. A non-finite loss on any rank stops every
        rank before the optimizer runs (fp16 gradient overflows are DeepSpeed's: the step is skipped)."""
        self.engine.train()
        sums: dict[str, float] = {}
        finite = torch.ones((), device=self.device)
        for i in range(self.accumulation):
            batch = self._to_device(next(micro_batches))
            loss, metrics = losses.compute(self.engine, batch, self.cfg.model.arch, self._tasks(self.step))
            finite = finite * torch.isfinite(loss.detach()).float()
            self.engine.backward(loss)
            if i == self.accumulation - 1:
                self._stop_unless_finite(finite)
            self.engine.step()
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v) / self.accumulation
        self.step += 1
        self.consumed += self.cfg.train.global_batch_size
        sums = _mean_over(sums, mcore.dp_group())
        norm = self.engine.get_global_grad_norm()
        if norm is not None:
            sums["grad_norm"] = float(norm)
        sums["lr"] = self.scheduler.get_last_lr()[0]
        if self.cfg.precision == "fp16":
            sums.update(loss_scale=self.engine.optimizer.loss_scaler.cur_scale, skipped_steps=self.engine.skipped_steps)
        return sums

    def _stop_unless_finite(self, finite: torch.Tensor) -> None:
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        if finite.item() < 1:
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

    def _loader(self, source, start: int, workers: int):
        return iter(make_loader(source, self.cfg.train.micro_batch_size, rank=self.dp_rank, world_size=self.dp,
                                consumed_samples=start, num_workers=workers))

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Metrics over `eval_steps` validation batches on every data-parallel rank, averaged."""
        self.engine.eval()
        sums: dict[str, float] = {}
        _, valid = self._sources(max(self.step - 1, 0))
        if valid is None:
            return {}
        data = self._loader(valid, 0, 0)
        n = 0
        for batch in data:
            _, metrics = losses.compute(self.engine, self._to_device(batch), self.cfg.model.arch,
                                        self._tasks(max(self.step - 1, 0)))
            if "mlm_acc" in metrics:  # what always answering the corpus's most frequent token would score
                target = batch["labels"][batch["labels"] != -100]
                metrics["mlm_unigram_acc"] = (target == self.most_frequent).float().mean()
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v)
            n += 1
            if n == self.cfg.train.eval_steps:
                break
        out = {f"valid_{k}": v for k, v in _mean_over({k: v / max(n, 1) for k, v in sums.items()},
                                                         mcore.dp_group()).items()}
        if "valid_lm_loss" in out:
            out["valid_ppl"] = math.exp(min(out["valid_lm_loss"], 50))
        return out

    def fit(self) -> dict:
        cfg = self.cfg
        os.makedirs(cfg.out_dir, exist_ok=True)
        if self.rank0:
            with open(os.path.join(cfg.out_dir, "config.yaml"), "w") as f:
                f.write(cfg.to_yaml())
        writer = _tensorboard(cfg.out_dir) if self.rank0 else None
        stage = cfg.ernie.stage_index(self.step)
        micro = self._loader(self._sources(self.step)[0], self.consumed, cfg.data.num_workers)
        tokens_per_step = cfg.train.global_batch_size * cfg.data.seq_len
        bar = _bar(cfg.train.steps, self.step) if self.rank0 else None
        t0, first, last_eval, history = time.time(), self.step, {}, []
        while self.step < cfg.train.steps:
            if cfg.ernie.stage_index(self.step) != stage:  # ERNIE 2.0: the next stage's tasks join
                stage = cfg.ernie.stage_index(self.step)
                micro = self._loader(self._sources(self.step)[0], self.consumed, cfg.data.num_workers)
                now = cfg.ernie.stages[stage]
                _log(f"step {self.step}: ERNIE stage {stage + 1}: " + (f"tasks {now.tasks}" if cfg.data.objective ==
                                                                      "ernie" else f"{now.knowledge_level}-level masking"))
            start = time.time()
            metrics = self.train_step(micro)
            dt = time.time() - start
            metrics.update(step_time_s=dt, samples_per_s=cfg.train.global_batch_size / dt, tokens_per_s=tokens_per_step / dt,
                           memory_gib=dev.peak_memory_gib(), **self._utilisation(cfg.train.global_batch_size / dt))
            if writer:
                for k, v in metrics.items():
                    writer.add_scalar(f"train/{k}", v, self.step)
                _append_jsonl(os.path.join(cfg.out_dir, "metrics.jsonl"), {"step": self.step, **metrics})
            if cfg.train.log_interval and self.step % cfg.train.log_interval == 0:
                (bar.write if bar is not None else _log)(f"step {self.step}: " + _fmt(metrics, tuple(metrics)))
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(_fmt(metrics, ("mlm_loss", "mlm_acc", "nsp_acc", "lm_loss", "lr", "samples_per_s",
                                                      "tokens_per_s")),
                                    refresh=False)
            if cfg.train.eval_interval and self.step % cfg.train.eval_interval == 0:
                last_eval = self.evaluate()
                history.append({"step": self.step, **last_eval})
                if writer:
                    for k, v in last_eval.items():
                        writer.add_scalar(f"valid/{k[6:]}", v, self.step)
                _log(f"step {self.step}: " + _fmt(last_eval, tuple(last_eval)))
            if cfg.checkpoint.interval and self.step % cfg.checkpoint.interval == 0 and self.step < cfg.train.steps:
                self.save()
        if bar is not None:
            bar.close()
        final = self.save()
        if not last_eval or history[-1]["step"] != self.step:
            last_eval = self.evaluate()
        elapsed = time.time() - t0
        summary = {"steps": self.step, "trained_steps": self.step - first, "seconds": round(elapsed, 1),
                   "samples": self.consumed, "checkpoint": final, **{k: round(v, 4) for k, v in last_eval.items()},
                   "tokens_per_s": round((self.step - first) * tokens_per_step / max(elapsed, 1e-9)),
                   **{k: round(v, 4) for k, v in self._utilisation((self.step - first) * cfg.train.global_batch_size
                                                                   / max(elapsed, 1e-9)).items()},
                   "skipped_steps": self.engine.skipped_steps, "peak_memory_gib": round(dev.peak_memory_gib(), 2),
                   "layout": {"tp": mcore.tp_size(), "dp": self.dp, "zero_stage": cfg.zero.stage,
                              "precision": cfg.precision}}
        if writer:
            writer.close()
        if self.rank0:
            with open(os.path.join(cfg.out_dir, "summary.json"), "w") as f:
                json.dump(summary, f, indent=2)
        return summary


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
    return Trainer(cfg).fit()
