"""The trainer's checkpoints (the format: pretrain/checkpoint.py): what a run trains on and whether it may resume
a checkpoint or start from one (`checkpoint.init_from`), and the manager that finds the newest complete one, saves,
restores any layout's into this one and prunes, every rank deciding together.
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import io
import json
import os
import random
import shutil
import socket
import time

import numpy as np
import torch
import torch.distributed as dist

from pretrain import device as dev
from pretrain import signals
from pretrain.checkpoint import (KINDS, LATEST, CheckpointError, Pieces, copy_tokenizer, file_records, mark_latest,
                                 model_config, read_meta, verify, write_meta, write_pieces)
from pretrain.models.config import FEATURES, unread
from ptm.files import FULL, fix, fsync_dir, save_safetensors, write_bytes, write_text

MODEL_SHAPE = ("arch", "vocab_size", "hidden_size", "num_layers", "decoder_layers", "num_heads", "head_dim",
               "ffn_hidden_size", "max_position_embeddings", "position_offset", "relative_buckets",
               "relative_max_distance", "type_vocab_size", "task_type_vocab_size", "embedding_size", "generator_size",
               *FEATURES)
NOT_IDENTITY = ("activation_checkpointing",)  # model settings that a resume may change (memory, not math)


def run_identity(cfg, corpora) -> dict:
    """What a run trains on, recorded in its checkpoints: tokenizer, vocabulary, objective, datasets, seed."""
    def fingerprint(corpus) -> str:
        shards = [(s["file"], s["sha256"]) for s in corpus.manifest["shards"]]
        return hashlib.sha256(json.dumps(shards).encode()).hexdigest()

    tokenizer = corpora[0].manifest["tokenizer"]
    return {"tokenizer_sha256": tokenizer["sha256"], "vocab_size": corpora[0].vocab_size,
            "objective": cfg.data.objective, "datasets": [fingerprint(c) for c in corpora], "seed": cfg.seed}


def resume_mismatches(ckpt: str, meta: dict, cfg, identity: dict) -> list[str]:
    """Why this run cannot resume `ckpt` (empty when it can): another model, tokenizer, vocabulary, objective
    or (unless checkpoint.allow_dataset_change) dataset. A field that neither model reads (T5's relative_buckets in
    two BERTs: `models.config.unread`) is none of its identity: a run that gave one unread can resume without it."""
    shape = model_config(meta) if "model" in meta else None
    theirs, mine = dataclasses.asdict(shape) if shape else {}, dataclasses.asdict(cfg.model)
    moot = unread(cfg.model) & (unread(shape) if shape else set())
    odd = [f"model.{k}={mine[k]!r} (checkpoint: {theirs.get(k)!r})" for k in mine
           if k not in NOT_IDENTITY and k not in moot and theirs.get(k) != mine[k]]
    run = meta.get("run", {})
    if run.get("tokenizer_sha256") not in (None, identity["tokenizer_sha256"]):
        odd.append(f"tokenizer sha256 {identity['tokenizer_sha256'][:12]} (checkpoint: {run['tokenizer_sha256'][:12]})")
    said = (theirs.get("vocab_size"), mine["vocab_size"]) == (run.get("vocab_size"), identity["vocab_size"])
    if run.get("vocab_size") not in (None, identity["vocab_size"]) and not said:  # (not as model.vocab_size again)
        odd.append(f"vocabulary size {identity['vocab_size']} (checkpoint: {run['vocab_size']})")
    if run.get("objective") not in (None, identity["objective"]):
        odd.append(f"data.objective={identity['objective']} (checkpoint: {run['objective']})")
    if odd:
        return [f"{ckpt} was trained differently: {'; '.join(odd)}; resume with its config.yaml and data, or use "
                "another out_dir"]
    if run.get("datasets") not in (None, identity["datasets"]) and not cfg.checkpoint.allow_dataset_change:
        return [f"{ckpt} was trained on other data than data.path={cfg.data.path}; set "
                "checkpoint.allow_dataset_change=true to continue on this data on purpose, or use the original data"]
    return []


def adopt_model_shape(cfg, ckpt: str) -> list[str]:
    """checkpoint.init_from: model sizes the config left unset come from the checkpoint; those it set must
    agree, but for `heads` (the trainer takes the weights of the heads both have). Returns the keys taken; raises
    CheckpointError listing each disagreement with both values."""
    shape = model_config(read_meta(ckpt))  # an older checkpoint's features from its arch
    theirs = dataclasses.asdict(shape)
    explicit = getattr(cfg, "explicit", frozenset())
    odd, taken = [], []
    for key in MODEL_SHAPE:
        mine = getattr(cfg.model, key)
        if theirs.get(key) == mine or key == "vocab_size" and not mine or key == "heads" and mine is not None:
            continue
        if key == "max_position_embeddings" and not shape.positional.table:  # no table: the config's limit alone
            continue
        if f"model.{key}" in explicit:
            odd.append(f"model.{key}={mine} (checkpoint: {theirs.get(key)})")
        else:
            setattr(cfg.model, key, theirs[key])
            taken.append(key)
    if odd:
        raise CheckpointError(f"checkpoint.init_from={ckpt} holds another model: {'; '.join(odd)}; remove these "
                              "keys from the config to take the checkpoint's, or init from another checkpoint")
    return taken


class Checkpoints:
    """A training run's checkpoints under OUT_DIR/checkpoints: find the newest complete one (falling back from
    a damaged `latest`), save, restore any layout's into this one, prune. Every rank calls every method: they
    are collective. `log` prints a line (on rank 0)."""

    visibility_tries, visibility_wait_s = 13, 5.0  # how long a rank's stale view of a checkpoint is waited for

    def __init__(self, out_dir: str, keep: int, log=print):
        self.out_dir, self.root, self.keep, self.log = out_dir, os.path.join(out_dir, "checkpoints"), keep, log

    # ---- finding -----------------------------------------------------------------------------------------

    def _names(self) -> list[str]:
        """Checkpoint names, `latest`'s first, then the others newest first, as rank 0 lists them: on a shared
        filesystem ranks can see different listings (after a requeue), and ranks deciding alone would run
        different collectives and hang."""
        return dev.rank0s(self._listed)

    def _listed(self) -> list[str]:
        steps = sorted((d for d in os.listdir(self.root) if d.startswith("step_")), reverse=True) \
            if os.path.isdir(self.root) else []
        try:
            with open(os.path.join(self.root, LATEST)) as f:
                latest = [f.read().strip()]
        except OSError:
            latest = []
        return list(dict.fromkeys(latest + steps))

    def newest_complete(self) -> str | None:
        """The checkpoint to resume: `latest` if it is complete, else the newest complete one (with a warning
        that says which and why); None when the run has none; an error when every one is damaged."""
        problems, damaged = [], []
        for name in self._names():
            ckpt = os.path.join(self.root, name)
            problem = self._verify(ckpt)
            if problem is None:
                if problems:
                    self._set_aside(damaged, name)
                    self.log(f"warning: {'; '.join(problems)}: resuming from {ckpt} instead"
                             + (f" ({', '.join(damaged)} renamed damaged-*)" if damaged else ""))
                return ckpt
            problems.append(f"{name} is damaged ({problem})")
            damaged += [name] if os.path.isdir(ckpt) else []
        if problems:
            raise CheckpointError(f"no complete checkpoint in {self.root}: {'; '.join(problems)}; restore them or "
                                  "train into a new out_dir")
        return None

    def _set_aside(self, damaged: list[str], good: str) -> None:
        """Rename damaged checkpoints to damaged-NAME (kept for inspection, never resumed or pruned; damaged-NAME.1,
        .2, ... when a step damaged before was trained again and damaged again) and point `latest` at the one resumed.
        Rank 0 renames; a failure is every rank's error (none waits for rank 0 alone)."""
        def rename() -> str | None:
            try:
                for name in damaged:
                    aside, n = os.path.join(self.root, f"damaged-{name}"), 0
                    while os.path.lexists(aside + (f".{n}" if n else "")):
                        n += 1
                    os.rename(os.path.join(self.root, name), aside + (f".{n}" if n else ""))
                mark_latest(self.out_dir, good)
            except OSError as e:
                return f"cannot set damaged checkpoints aside in {self.root} ({e}); move them out of it by hand"
            return None

        problem = dev.rank0s(rename)
        if problem:
            raise CheckpointError(problem)

    def _verify(self, ckpt: str) -> str | None:
        """`verify` with the hashing shared among the ranks; every rank gets the same answer. Whether the files
        are there and whole is rank 0's to say; a file rank 0 sees that another rank does not (a shared
        filesystem's cache lagging on that node) is waited for, `visibility_tries` x `visibility_wait_s`, then
        an error naming the rank and its host: not a damaged checkpoint."""
        world = dist.get_world_size() if dist.is_initialized() else 1
        if world == 1:
            return verify(ckpt)
        problem = dev.rank0s(lambda: verify(ckpt, hashes=False))
        if problem:
            return problem
        for attempt in range(self.visibility_tries):  # the same count on every rank: they decide together
            every = [None] * world
            dist.all_gather_object(every, (verify(ckpt, hashes=False), socket.gethostname()))
            unseen = [(rank, seen, host) for rank, (seen, host) in enumerate(every) if seen]
            if not unseen:
                break
            if attempt + 1 == self.visibility_tries:
                rank, seen, host = unseen[0]
                raise CheckpointError(
                    f"rank {rank} on {host} does not see {ckpt} as rank 0 does ({seen}) after "
                    f"{self.visibility_tries * self.visibility_wait_s:g} s: that node's view of the shared filesystem "
                    "is stale; check its mount (e.g. NFS actimeo/lookupcache) and resubmit")
            time.sleep(self.visibility_wait_s)
        every = [None] * world
        dist.all_gather_object(every, verify(ckpt, dist.get_rank(), world))
        return next((p for p in every if p), None)

    # ---- saving ------------------------------------------------------------------------------------------

    def save(self, step: int, trainer_state: dict, run, optimizer, *, tp_rank: int, dp_rank: int, meta: dict,
             config_yaml: str, tokenizer_dir: str, rank_files: dict | None = None) -> str:
        """Write step_N: each process its own pieces (no gathering), RNG states and `rank_files` ({relative path:
        {name: tensor}}, safetensors), rank 0 the rest; renamed into place when every file is on disk, then `latest`
        is pointed at it and old ones are pruned. `run`: the engine and the layout of its optimizer's tensors
        (`engine.Parallelized`); `meta`: write_meta's keyword arguments (model, params, tp, dp, step, extra)."""
        from pretrain.parallel.layout import engine_counters, loss_scale_state

        name = f"step_{step:08d}"
        final, tmp = os.path.join(self.root, name), os.path.join(self.root, f".{name}.tmp")

        def start() -> None:  # (what an earlier write left, cut short by a crash or a full disk, goes first)
            for stale in glob.glob(os.path.join(self.root, ".step_*.tmp")):
                shutil.rmtree(stale, ignore_errors=True)
            os.makedirs(os.path.join(tmp, "rng"))

        self._written(final, tmp, [dev.rank0s(lambda: _attempt(start))])
        layout, state = run.layout, optimizer.state

        def own() -> dict:
            written = []
            if layout.owner:
                for kind in KINDS:
                    pieces = {f"{s.name}@{s.start}": (master if kind == "param" else state[master][kind]
                                                      ).reshape(-1)[s.offset:s.offset + s.length]
                              for master, segments in layout.tensors if kind == "param" or state[master]
                              for s in segments}
                    if pieces:
                        written.append(write_pieces(tmp, kind, tp_rank, dp_rank if layout.partitioned else 0, pieces))
            for relative, tensors in (rank_files or {}).items():
                path = os.path.join(tmp, relative)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                save_safetensors({k: v.contiguous() for k, v in tensors.items()}, path)  # (flushed by file_records)
                written.append(path)
            rng = os.path.join(tmp, "rng", f"rank{dist.get_rank():05d}.pt")
            write_bytes(rng, _torch_bytes(_rng_states()))
            return file_records(tmp, [*written, rng])

        mine = _attempt(own)
        signals.pause("checkpoint")
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        self._written(final, tmp, every)

        def finish() -> None:
            steps = [s["step"] for s in state.values() if s]
            write_bytes(os.path.join(tmp, "trainer.pt"), _torch_bytes(
                {**trainer_state, "optimizer_steps": steps[0] if steps else 0, "idle_steps": dict(optimizer.idle_steps),
                 "loss_scaler": loss_scale_state(run.engine.optimizer), "engine": engine_counters(run.engine)}))
            copy_tokenizer(tokenizer_dir, tmp)
            write_text(os.path.join(tmp, "config.yaml"), config_yaml)
            files = {k: v for records, _ in every for k, v in records.items()}
            rest = [os.path.join(d, f) for d, _, fs in os.walk(tmp) for f in fs]
            files.update(file_records(tmp, [p for p in rest if os.path.relpath(p, tmp) not in files]))
            write_meta(tmp, **meta, files=files)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)  # complete checkpoints only ever appear under their final name
            fsync_dir(self.root)
            mark_latest(self.out_dir, name)
            self.prune()

        self._written(final, tmp, [dev.rank0s(lambda: _attempt(finish))])
        return final

    def _written(self, final: str, tmp: str, outcomes: list) -> None:
        """Every rank's (result, problem) of a part of writing checkpoint `final`; on a problem (a full disk, a quota:
        `_attempt`), rank 0 removes what was written and every rank raises the same CheckpointError."""
        failed = [(rank, problem) for rank, (_, problem) in enumerate(outcomes) if problem]
        if not failed:
            return
        if dist.get_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        name, (rank, (problem, code)) = os.path.basename(final), failed[0]
        if os.path.isdir(final):  # (written whole: `latest` or the pruning after it was refused)
            listed = self._listed()[:1]
            kept = f"{name} is whole" + ("; a re-run resumes from it" if listed == [name] else
                                         f" but `latest` still names {listed[0]}, which a re-run resumes from")
        else:
            last = [n for n in self._listed() if n != name][:1]
            kept = "what it wrote is removed; " + (f"{last[0]}, the last checkpoint, is untouched" if last else
                                                   "the run has no earlier checkpoint")
        remedy = (f"free space there (a save needs room for one checkpoint more than the checkpoint.keep={self.keep} "
                  "kept: an older step_N can go) or raise the quota") if code in FULL and self.keep else fix(code)
        raise CheckpointError(
            f"cannot write checkpoint {name} in {self.root}" + (f" (rank {rank})" if len(outcomes) > 1 else "")
            + f": {problem}; {kept}; {remedy} and re-run the same command to resume")

    def prune(self) -> None:
        """Keep the newest `keep` checkpoints (all when 0), and always the one `latest` names."""
        names = sorted(d for d in os.listdir(self.root) if d.startswith("step_"))
        latest = self._listed()[:1]  # rank 0 alone prunes
        for old in names[:-self.keep] if self.keep else []:
            if old not in latest:
                shutil.rmtree(os.path.join(self.root, old))

    # ---- restoring ---------------------------------------------------------------------------------------

    def restore(self, ckpt: str, run, optimizer, scheduler, *, tp_rank: int, tp: int, same_layout: bool) -> dict:
        """Optimizer pieces, schedule, loss scale, DeepSpeed's counters and (for the same layout) every RNG
        stream from a checkpoint written by any layout; the weights were loaded into the model before DeepSpeed
        copied them. Returns trainer.pt (step, consumed samples, ...)."""
        from pretrain.parallel.layout import restore_engine_counters, restore_loss_scale

        path = os.path.join(ckpt, "trainer.pt")
        if not os.path.isfile(path):
            raise CheckpointError(f"{ckpt} holds weights only (no trainer.pt) and cannot be resumed; start a new "
                                  "out_dir with checkpoint.init_from pointing at it")
        pieces, trainer = Pieces(ckpt), torch.load(path, weights_only=False)
        kinds = [k for k in KINDS if pieces.has(k)]
        layout, state = run.layout, optimizer.state
        optimizer.idle_steps = dict(trainer.get("idle_steps", {}))  # (by parameter name: any layout)
        places: dict[str, list] = {}
        for master, segments in layout.tensors:
            if "exp_avg" in kinds:
                state[master].update(step=trainer["optimizer_steps"], exp_avg=torch.zeros_like(master),
                                     exp_avg_sq=torch.zeros_like(master))
            for s in segments:
                places.setdefault(s.name, []).append((master, s))
        with torch.no_grad():
            for name, where in places.items():
                for kind in kinds:
                    src = pieces.shard(kind, name, tp_rank, tp).reshape(-1)
                    for master, s in where:
                        dst = master if kind == "param" else state[master][kind]
                        dst.view(-1)[s.offset:s.offset + s.length].copy_(src[s.start:s.start + s.length])
        # the schedule's position from the checkpoint, its values from this run's config (train.steps, optimizer.lr
        # or the warmup may have changed since): stepping onto the position sets every group's lr
        position = trainer["scheduler"]["last_epoch"]
        scheduler.load_state_dict({**trainer["scheduler"], "base_lrs": scheduler.base_lrs, "last_epoch": position - 1})
        scheduler.step()
        restore_loss_scale(run.engine.optimizer, trainer["loss_scaler"])
        restore_engine_counters(run.engine, trainer["engine"])
        rng = os.path.join(ckpt, "rng", f"rank{dist.get_rank():05d}.pt")
        if same_layout and os.path.isfile(rng):
            _set_rng_states(torch.load(rng, weights_only=False))
            trainer["rng_restored"] = True
        return trainer


def _rng_states() -> dict:
    from pretrain.parallel import mcore

    return {"torch": dev.rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "tracker": mcore.rng_tracker().get_states()}


def _set_rng_states(rng: dict) -> None:
    from pretrain.parallel import mcore

    dev.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    mcore.rng_tracker().set_states(rng["tracker"])


def _attempt(write) -> tuple:
    """(`write()`'s result, None), or (None, (what stopped it, its error number)) when the system refused a write: a
    full disk, a quota, permissions."""
    try:
        return write(), None
    except OSError as e:
        return None, (f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else ""), e.errno)


def _torch_bytes(obj) -> bytes:
    """`obj` as torch.save writes it (written by ptm.files: a full disk is an OSError, not torch's RuntimeError)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()
