"""ptm checkpoints: one directory per step, in a layout-free form, with a `latest` pointer written last, and
the manager that saves, finds, checks, restores and prunes them for the trainer.

    OUT_DIR/checkpoints/latest                 text: the name of the newest complete checkpoint
    OUT_DIR/checkpoints/step_00000100/
        meta.json                              format, step, model config, the layout it was written from
                                               (tp, dp, zero stage), every parameter's full shape and split dim,
                                               what the run trained on (tokenizer, datasets, objective, seed) and
                                               the size and sha256 of every other file (written last)
        shards/{kind}-tpTT-dpDDD.safetensors   pieces of fp32 tensors, kind = param | exp_avg | exp_avg_sq
        trainer.pt                             LR schedule, loss scaler, step, data position (when training)
        rng/rankRRRRR.pt                       each process's RNG states (when training)
        memory/dpDDD.safetensors               a recurrent model's memory of the streams of each data-parallel rank
                                               (model.mem_len: pretrain/models/recurrence.py)
        config.yaml                            the resolved training config
        tokenizer/                             the dataset's tokenizer (ptm_tokenizer.json + files)

A piece is stored under `NAME@START`: elements START.. of the flattened TP shard NAME of TP rank TT. Each
process writes the pieces it owns (its ZeRO partition of its TP shard), so saving needs no gathering and
any layout can read any other: `Pieces` reassembles a whole parameter, or another TP size's shard of it.
A consolidated checkpoint (tp=1, dp=1) holds every parameter as one piece `NAME@0` with its shape, and is
readable by any safetensors tool. Every file is flushed to disk before the directory gets its final name and
before `latest` moves; a checkpoint whose files do not match meta.json is damaged, and resuming falls back to
the newest complete one.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import shutil
import socket
import time

import numpy as np
import torch
import torch.distributed as dist
from safetensors import safe_open

from pretrain import device as dev
from pretrain import signals
from pretrain.families import VOCAB_ROWS
from pretrain.models.config import FEATURES, ModelConfig
from ptm.files import fsync_dir, save_safetensors, sha256_file, write_json, write_text

FORMAT = "ptm-checkpoint"
VERSION = 2
LATEST = "latest"
KINDS = ("param", "exp_avg", "exp_avg_sq")  # weights (fp32 master copies) and the Adam/LAMB moments


class CheckpointError(Exception):
    """A missing, incomplete or mismatched checkpoint; the message names it and the fix."""


def resolve(path: str) -> str:
    """A checkpoint directory, or a run's out_dir (its latest checkpoint)."""
    if os.path.isfile(os.path.join(path, "meta.json")):
        return path
    pointer = os.path.join(path, "checkpoints", LATEST)
    if os.path.isfile(pointer):
        with open(pointer, errors="replace") as f:
            name = f.read().strip()
        if not os.path.isdir(os.path.join(path, "checkpoints", name)):
            raise CheckpointError(f"{pointer} names {name!r}, which is not a checkpoint of this run; pass one of its "
                                  f"checkpoints/step_N directories")
        return os.path.join(path, "checkpoints", name)
    raise CheckpointError(f"{path} is neither a ptm checkpoint (no meta.json) nor a run directory with "
                          f"checkpoints/{LATEST}; pass a checkpoint directory or a training out_dir")


def _meta(ckpt: str) -> tuple[dict | None, str | None, str | None]:
    """(meta.json, None, None), or (None, what is wrong with it naming the file, the fix)."""
    path = os.path.join(ckpt, "meta.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not even text
        return None, f"{path} is unreadable ({str(e).splitlines()[0]})", "use another checkpoint"
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        return None, f"{path} is not a {FORMAT} v{VERSION} file", "convert it with this ptm version"
    return meta, None, None


def read_meta(ckpt: str) -> dict:
    meta, problem, fix = _meta(ckpt)
    if problem:
        raise CheckpointError(f"{problem}; {fix}")
    return meta


def model_config(meta: dict) -> ModelConfig:
    return ModelConfig(**meta["model"])


def shard_path(ckpt: str, kind: str, tp_rank: int, dp_rank: int) -> str:
    return os.path.join(ckpt, "shards", f"{kind}-tp{tp_rank:02d}-dp{dp_rank:03d}.safetensors")


def write_pieces(ckpt: str, kind: str, tp_rank: int, dp_rank: int, pieces: dict[str, torch.Tensor]) -> str:
    """One shard file of `NAME@START` pieces (fp32), written under a temporary name, flushed to disk and
    renamed; returns its path."""
    path = shard_path(ckpt, kind, tp_rank, dp_rank)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_safetensors({k: v.detach().float().contiguous().cpu() for k, v in pieces.items()}, path + ".tmp")
    _fsync(path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


def _fsync(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def file_records(ckpt: str, paths=None) -> dict[str, dict]:
    """{path relative to `ckpt`: {"bytes", "sha256"}} of `paths` (default: every file but meta.json), each
    flushed to disk first."""
    if paths is None:
        paths = [os.path.join(d, f) for d, _, files in os.walk(ckpt) for f in files if f != "meta.json"]
    out = {}
    for path in sorted(paths):
        _fsync(path)
        out[os.path.relpath(path, ckpt)] = {"bytes": os.path.getsize(path), "sha256": sha256_file(path)}
    return out


def save_model(ckpt: str, state: dict[str, torch.Tensor]) -> None:
    """Whole fp32 weights as a consolidated (tp=1) checkpoint's parameter file (non-tensor entries, such as
    megatron-core's `_extra_state`, are not weights and are dropped)."""
    write_pieces(ckpt, "param", 0, 0, {f"{k}@0": v for k, v in state.items() if isinstance(v, torch.Tensor)})


def write_meta(ckpt: str, *, model: ModelConfig, params: dict[str, dict], tp: int = 1, dp: int = 1,
               step: int = 0, extra: dict | None = None, files: dict | None = None) -> None:
    """meta.json, last: `params` is name -> {"shape": full shape, "split_dim": dim split over TP ranks or
    None}; `files` the records of the other files (default: computed here from every file in `ckpt`)."""
    from ptm import __version__

    meta = {"format": FORMAT, "version": VERSION, "ptm_version": __version__, "step": step, "tp": tp, "dp": dp,
            "model": dataclasses.asdict(model), "params": params, **(extra or {}),
            "files": file_records(ckpt) if files is None else files}
    write_json(os.path.join(ckpt, "meta.json"), meta)
    for d, _, _ in os.walk(ckpt):
        fsync_dir(d)


def split_dim(param: torch.nn.Parameter) -> int | None:
    """The dimension megatron-core's tensor-parallel layers split `param` along (None: replicated)."""
    return param.partition_dim if getattr(param, "tensor_model_parallel", False) else None


def param_info(named_parameters, tp: int = 1) -> dict[str, dict]:
    """meta.json's `params` from (name, parameter) pairs of TP rank 0 of `tp` (ZeRO-3 keeps the true shape in
    `ds_shape`)."""
    info = {}
    for name, p in named_parameters:
        shape, dim = list(getattr(p, "ds_shape", p.shape)), split_dim(p)
        if dim is not None:
            shape[dim] *= tp
        info[name] = {"shape": shape, "split_dim": dim}
    return info


def verify(ckpt: str, rank: int = 0, world: int = 1, hashes: bool = True) -> str | None:
    """What is wrong with `ckpt` (a one-line reason naming the file), or None when it is complete: meta.json
    readable, every file it records present with its size, and (with `hashes`, this rank's share `rank::world`
    of them) its sha256."""
    meta, problem, _ = _meta(ckpt)
    if problem:
        return problem
    files = meta.get("files")
    if files is None:  # written before ptm recorded files: each shard must at least open
        folder = os.path.join(ckpt, "shards")
        for f in sorted(os.listdir(folder)) if os.path.isdir(folder) and hashes else []:
            try:
                safe_open(os.path.join(folder, f), framework="pt")
            except Exception as e:
                return f"{os.path.join(folder, f)} is unreadable ({e})"
        return None
    for i, (rel, record) in enumerate(sorted(files.items())):
        path = os.path.join(ckpt, rel)
        if not os.path.isfile(path):
            return f"{path} is missing"
        if os.path.getsize(path) != record["bytes"]:
            return f"{path} has {os.path.getsize(path)} bytes, meta.json records {record['bytes']} (truncated?)"
        if hashes and i % world == rank and sha256_file(path) != record["sha256"]:
            return f"{path} does not match its sha256 in meta.json (corrupted)"
    return None


def copy_tokenizer(src_dir: str, ckpt: str) -> None:
    dst = os.path.join(ckpt, "tokenizer")
    if os.path.abspath(src_dir) != os.path.abspath(dst):
        shutil.copytree(src_dir, dst, dirs_exist_ok=True)


def check_complete(ckpt: str) -> str:
    """`ckpt`, or CheckpointError naming the damaged file (for tools that read a checkpoint)."""
    problem = verify(ckpt)
    if problem:
        raise CheckpointError(f"{problem}: the checkpoint is damaged; use another one (an earlier step_N)")
    return ckpt


def mark_latest(out_dir: str, name: str) -> None:
    """Point `latest` at a finished checkpoint (atomic rename: readers never see a partial pointer)."""
    write_text(os.path.join(out_dir, "checkpoints", LATEST), name + "\n")
    fsync_dir(os.path.join(out_dir, "checkpoints"))


class Pieces:
    """Read tensors of a checkpoint of any layout: whole, or as the shard of any TP size. Files are opened
    lazily (memory-mapped) and one parameter is assembled at a time."""

    def __init__(self, ckpt: str):
        self.ckpt, self.meta = ckpt, read_meta(ckpt)
        self.params: dict[str, dict] = self.meta["params"]
        self.tp = self.meta["tp"]
        # kind -> name -> tp rank -> [(start, file, key)]
        self.where: dict[str, dict[str, dict[int, list]]] = {k: {} for k in KINDS}
        folder = os.path.join(ckpt, "shards")
        for file in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if not file.endswith(".safetensors"):
                continue
            kind, tp_rank, _ = file.removesuffix(".safetensors").rsplit("-", 2)
            for key in self._open(os.path.join(folder, file)).keys():
                name, start = key.rsplit("@", 1)
                self.where[kind].setdefault(name, {}).setdefault(int(tp_rank[2:]), []).append(
                    (int(start), os.path.join(folder, file), key))
        missing = [n for n in self.params if n not in self.where["param"]]
        if missing:
            raise CheckpointError(f"{ckpt} has no weights for {missing[:3]} ({len(missing)} parameters); the "
                                  "checkpoint is incomplete: resume from an earlier one")

    @functools.lru_cache(maxsize=None)
    def _open(self, path: str):
        try:
            return safe_open(path, framework="pt")
        except Exception as e:
            raise CheckpointError(f"{path} is unreadable ({e}); the checkpoint is damaged: use an earlier one") from None

    def has(self, kind: str) -> bool:
        return bool(self.where[kind])

    def _tp_shard(self, kind: str, name: str, tp_rank: int) -> torch.Tensor:
        shape = list(self.params[name]["shape"])
        dim = self.params[name]["split_dim"]
        if dim is not None:
            shape[dim] //= self.tp
        flat = torch.empty(int(torch.Size(shape).numel()), dtype=torch.float32)
        covered = 0
        for start, path, key in self.where[kind].get(name, {}).get(tp_rank, []):
            piece = self._open(path).get_tensor(key).reshape(-1)
            flat[start:start + piece.numel()] = piece
            covered += piece.numel()
        if covered != flat.numel():
            raise CheckpointError(f"{self.ckpt}: {kind} of {name} (TP rank {tp_rank}) has {covered} of {flat.numel()} "
                                  "elements; the checkpoint is incomplete: resume from an earlier one")
        return flat.view(shape)

    def full(self, kind: str, name: str) -> torch.Tensor:
        """The whole tensor (all TP shards joined)."""
        dim = self.params[name]["split_dim"]
        if dim is None or self.tp == 1:
            return self._tp_shard(kind, name, 0)
        return torch.cat([self._tp_shard(kind, name, r) for r in range(self.tp)], dim=dim)

    def shard(self, kind: str, name: str, tp_rank: int, tp: int) -> torch.Tensor:
        """The slice TP rank `tp_rank` of `tp` holds."""
        dim = self.params[name]["split_dim"]
        if dim is None:
            return self._tp_shard(kind, name, 0)
        if tp == self.tp:
            return self._tp_shard(kind, name, tp_rank)
        return self.full(kind, name).chunk(tp, dim=dim)[tp_rank].contiguous()


def load_full_model(ckpt: str) -> dict[str, torch.Tensor]:
    """Every parameter, whole (fp32), from a checkpoint of any layout."""
    pieces = Pieces(ckpt)
    return {name: pieces.full("param", name) for name in pieces.params}


def load_model_shard(ckpt: str, tp_rank: int, tp: int, vocab_rows: int | None = None) -> dict[str, torch.Tensor]:
    """The weights TP rank `tp_rank` of `tp` holds, from a checkpoint of any layout; `vocab_rows` pads the
    vocabulary (zero rows) to a larger model's padded size."""
    pieces = Pieces(ckpt)
    if vocab_rows is None:
        return {name: pieces.shard("param", name, tp_rank, tp) for name in pieces.params}
    out = {}
    for name, info in pieces.params.items():
        t = pieces.full("param", name)
        if name in VOCAB_ROWS and t.shape[0] < vocab_rows:
            t = torch.cat([t, t.new_zeros(vocab_rows - t.shape[0], *t.shape[1:])])
        out[name] = t if info["split_dim"] is None else t.chunk(tp, dim=info["split_dim"])[tp_rank].contiguous()
    return out


# ---- the trainer's checkpoints ----------------------------------------------------------------------------

MODEL_SHAPE = ("arch", "vocab_size", "hidden_size", "num_layers", "decoder_layers", "num_heads", "head_dim",
               "ffn_hidden_size", "max_position_embeddings", "position_offset", "relative_buckets",
               "relative_max_distance", "type_vocab_size", "task_type_vocab_size", "embedding_size", "generator_size",
               *FEATURES)
NOT_IDENTITY = ("activation_checkpointing",)  # model settings that a resume may change (memory, not math)


def run_identity(cfg, corpora) -> dict:
    """What a run trains on, recorded in its checkpoints: tokenizer, vocabulary, objective, datasets, seed."""
    import hashlib

    def fingerprint(corpus) -> str:
        shards = [(s["file"], s["sha256"]) for s in corpus.manifest["shards"]]
        return hashlib.sha256(json.dumps(shards).encode()).hexdigest()

    tokenizer = corpora[0].manifest["tokenizer"]
    return {"tokenizer_sha256": tokenizer["sha256"], "vocab_size": corpora[0].vocab_size,
            "objective": cfg.data.objective, "datasets": [fingerprint(c) for c in corpora], "seed": cfg.seed}


def tokenizer_sha256(ckpt: str) -> str | None:
    """The sha256 of the tokenizer stored with a checkpoint or a dataset (in tokenizer/), or beside the weights of a
    Hugging Face export of ptm's; None if it has none."""
    for where in (os.path.join(ckpt, "tokenizer", "ptm_tokenizer.json"), os.path.join(ckpt, "ptm_tokenizer.json")):
        try:
            with open(where) as f:
                return json.load(f).get("sha256")
        except OSError:
            pass
    return None


def resume_mismatches(ckpt: str, meta: dict, cfg, identity: dict) -> list[str]:
    """Why this run cannot resume `ckpt` (empty when it can): another model, tokenizer, vocabulary, objective
    or (unless checkpoint.allow_dataset_change) dataset."""
    theirs = dataclasses.asdict(model_config(meta)) if "model" in meta else {}
    mine = dataclasses.asdict(cfg.model)
    odd = [f"model.{k}={mine[k]!r} (checkpoint: {theirs.get(k)!r})" for k in mine
           if k not in NOT_IDENTITY and theirs.get(k) != mine[k]]
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
        rank0 = dist.get_rank() == 0
        if rank0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(os.path.join(tmp, "rng"))
        dist.barrier()
        layout, state, written = run.layout, optimizer.state, []
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
            save_safetensors({k: v.contiguous() for k, v in tensors.items()}, path)
            _fsync(path)
            written.append(path)
        rng = os.path.join(tmp, "rng", f"rank{dist.get_rank():05d}.pt")
        torch.save(_rng_states(), rng)
        signals.pause("checkpoint")
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, file_records(tmp, [*written, rng]))
        if rank0:
            steps = [s["step"] for s in state.values() if s]
            torch.save({**trainer_state, "optimizer_steps": steps[0] if steps else 0,
                        "loss_scaler": loss_scale_state(run.engine.optimizer),
                        "engine": engine_counters(run.engine)}, os.path.join(tmp, "trainer.pt"))
            copy_tokenizer(tokenizer_dir, tmp)
            write_text(os.path.join(tmp, "config.yaml"), config_yaml)
            files = {k: v for records in every for k, v in records.items()}
            own = [os.path.join(d, f) for d, _, fs in os.walk(tmp) for f in fs]
            files.update(file_records(tmp, [p for p in own if os.path.relpath(p, tmp) not in files]))
            write_meta(tmp, **meta, files=files)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)  # complete checkpoints only ever appear under their final name
            fsync_dir(self.root)
            mark_latest(self.out_dir, name)
            self.prune()
        dist.barrier()
        return final

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
