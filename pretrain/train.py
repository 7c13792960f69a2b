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
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist

from data_prep.dataset import Corpus
from pretrain import checkpoint as C
from pretrain import device as dev
from pretrain import losses, optim
from pretrain.config import Config, ConfigError
from pretrain.data.factory import build_sources
from pretrain.data.loader import make_loader
from pretrain.models.ernie_heads import ErnieTaskHeads
from pretrain.models.model import Pretraining
from pretrain.parallel import mcore

_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


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


class Trainer:
    def __init__(self, cfg: Config):
        mcore.initialize(cfg.parallel.tp, cfg.seed)
        self.world = dist.get_world_size()
        self.dp = self.world // cfg.parallel.tp
        self.dp_rank = dist.get_rank() // cfg.parallel.tp
        cfg.validate(dp=self.dp)
        self.cfg = cfg
        self.device = dev.device()
        self.corpora = _datasets(cfg)
        sample = self.corpora[0].shards[0].values["input_ids"][:10_000_000]
        self.most_frequent = int(np.bincount(sample, minlength=cfg.model.vocab_size).argmax())
        self.model = Pretraining(cfg.model)
        if cfg.data.objective == "ernie":
            labelled = {task: Corpus(path).manifest["num_labels"] for task, path in cfg.ernie.task_data.items()}
            self.model.tasks = ErnieTaskHeads(cfg.model.hidden_size, cfg.model.init_std, labelled)
        self.model.to(self.device)
        self.optimizer = optim.build(self.model, cfg.optimizer)
        self.scheduler = optim.Schedule.from_config(cfg.optimizer, cfg.train.steps).scheduler(self.optimizer)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.precision == "fp16")
        self.accumulation = cfg.train.global_batch_size // (cfg.train.micro_batch_size * self.dp)
        self.step = self.consumed = 0
        self._built: dict = {}  # stage index -> (train, valid) sources
        self.rank0 = dist.get_rank() == 0
        resumed = self._resume()
        if not resumed and cfg.checkpoint.init_from:
            self._init_from(cfg.checkpoint.init_from)

    # ---- checkpoints ---------------------------------------------------------------------------------

    def _resume(self) -> bool:
        try:
            ckpt = C.resolve(self.cfg.out_dir)
        except C.CheckpointError:
            return False
        meta = C.read_meta(ckpt)
        if meta["tp"] != self.cfg.parallel.tp:
            raise C.CheckpointError(f"{ckpt} was written with parallel.tp={meta['tp']}; resume with that, or "
                                    "start a new out_dir with checkpoint.init_from pointing at it")
        if C.model_config(meta) != self.cfg.model:
            raise C.CheckpointError(f"{ckpt} holds a different model than the config's model section; use "
                                    "the checkpoint's config.yaml or another out_dir")
        state = C.load_model_shard(ckpt, mcore.tp_rank(), self.cfg.parallel.tp)
        self.model.load_state_dict(state, strict=False)
        trainer = torch.load(os.path.join(ckpt, f"trainer-tp{mcore.tp_rank():02d}.pt"), weights_only=False)
        self.optimizer.load_state_dict(trainer["optimizer"])
        self.scheduler.load_state_dict(trainer["scheduler"])
        self.scaler.load_state_dict(trainer["scaler"])
        self.step, self.consumed = trainer["step"], trainer["consumed"]
        dev.set_rng_state(trainer["rng"]["torch"])
        np.random.set_state(trainer["rng"]["numpy"])
        random.setstate(trainer["rng"]["python"])
        mcore.rng_tracker().set_states(trainer["rng"]["tracker"])
        _log(f"resumed from {ckpt} at step {self.step} ({self.consumed:,} samples consumed)")
        return True

    def _init_from(self, path: str) -> None:
        ckpt = C.resolve(path)
        state = C.load_model_shard(ckpt, mcore.tp_rank(), self.cfg.parallel.tp,
                                   vocab_rows=self.model.embeddings.word.weight.shape[0] * self.cfg.parallel.tp)
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        if unexpected or missing:
            raise C.CheckpointError(f"{ckpt} does not fit this model: missing {missing[:4]}, unexpected "
                                    f"{unexpected[:4]}; check the model section against the checkpoint's meta.json")
        _log(f"initialised weights from {ckpt}")

    def save(self) -> str:
        cfg = self.cfg
        name = f"step_{self.step:08d}"
        root = os.path.join(cfg.out_dir, "checkpoints")
        final = os.path.join(root, name)
        tmp = os.path.join(root, f".{name}.tmp")
        if self.rank0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        dist.barrier()
        if self.dp_rank == 0:  # one copy of each TP shard
            C.save_model(tmp, self.model.state_dict(), mcore.tp_rank())
            torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                        "scaler": self.scaler.state_dict(), "step": self.step, "consumed": self.consumed,
                        "rng": {"torch": dev.rng_state(), "numpy": np.random.get_state(),
                                "python": random.getstate(), "tracker": mcore.rng_tracker().get_states()}},
                       os.path.join(tmp, f"trainer-tp{mcore.tp_rank():02d}.pt"))
        dist.barrier()
        if self.rank0:
            corpus = self.corpora[0]
            C.copy_tokenizer(os.path.join(corpus.path, "tokenizer"), tmp)
            with open(os.path.join(tmp, "config.yaml"), "w") as f:
                f.write(cfg.to_yaml())
            C.write_meta(tmp, model=cfg.model, tp=cfg.parallel.tp, step=self.step,
                         extra={"consumed_samples": self.consumed,
                                "nfkc": corpus.manifest["options"]["text"]["nfkc"]})
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)  # complete checkpoints only ever appear under their final name
            C.mark_latest(cfg.out_dir, name)
            self._prune(root)
        dist.barrier()
        return final

    def _prune(self, root: str) -> None:
        keep = self.cfg.checkpoint.keep
        steps = sorted(d for d in os.listdir(root) if d.startswith("step_"))
        for old in steps[:-keep] if keep else []:
            shutil.rmtree(os.path.join(root, old), ignore_errors=True)

    # ---- steps ---------------------------------------------------------------------------------------

    def _autocast(self):
        dtype = _DTYPES[self.cfg.precision]
        return torch.autocast(self.device.type, dtype=dtype) if dtype else nullcontext()

    def _to_device(self, batch: dict) -> dict:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def train_step(self, micro_batches) -> dict:
        self.model.train()
        sums: dict[str, float] = {}
        for _ in range(self.accumulation):
            batch = self._to_device(next(micro_batches))
            with self._autocast():
                loss, metrics = losses.compute(self.model, batch, self.cfg.model.arch)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"loss is {loss.item()} at step {self.step} (samples {self.consumed:,} "
                                         f"to {self.consumed + self.cfg.train.global_batch_size:,}); lower "
                                         "optimizer.lr or check the data")
            self.scaler.scale(loss / self.accumulation).backward()
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v) / self.accumulation
        self.scaler.unscale_(self.optimizer)
        norm = optim.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip or math.inf)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.consumed += self.cfg.train.global_batch_size
        sums["grad_norm"] = float(norm)
        sums["lr"] = self.scheduler.get_last_lr()[0]
        return sums

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
        self.model.eval()
        sums: dict[str, float] = {}
        _, valid = self._sources(max(self.step - 1, 0))
        if valid is None:
            return {}
        data = self._loader(valid, 0, 0)
        n = 0
        for batch in data:
            with self._autocast():
                _, metrics = losses.compute(self.model, self._to_device(batch), self.cfg.model.arch)
            if "mlm_acc" in metrics:  # what always answering the corpus's most frequent token would score
                target = batch["labels"][batch["labels"] != -100]
                metrics["mlm_unigram_acc"] = (target == self.most_frequent).float().mean()
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v)
            n += 1
            if n == self.cfg.train.eval_steps:
                break
        out = {f"valid_{k}": v / max(n, 1) for k, v in sums.items()}
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
            metrics.update(samples_per_s=cfg.train.global_batch_size / dt, tokens_per_s=tokens_per_step / dt)
            if writer:
                for k, v in metrics.items():
                    writer.add_scalar(f"train/{k}", v, self.step)
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
                   "tokens_per_s": round((self.step - first) * tokens_per_step / max(elapsed, 1e-9))}
        if writer:
            writer.close()
        if self.rank0:
            with open(os.path.join(cfg.out_dir, "summary.json"), "w") as f:
                json.dump(summary, f, indent=2)
        return summary


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
