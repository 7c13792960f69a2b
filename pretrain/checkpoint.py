"""ptm checkpoints: one directory per step, in a layout-free form, with a `latest` pointer written last (the
trainer's manager that saves, finds, restores and prunes them: pretrain/checkpoint_manager.py).

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
import errno
import functools
import json
import os

import torch
from safetensors import safe_open

from pretrain.families import VOCAB_ROWS
from pretrain.models.config import ModelConfig
from ptm.files import copy_tree, fsync_dir, save_safetensors, sha256_file, write_json, write_text

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
        copy_tree(src_dir, dst)


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
            if os.strerror(errno.ENOMEM) in str(e):  # (the mapping was refused: the file is not at fault)
                raise CheckpointError(f"{path} could not be mapped: host memory ran out ({os.strerror(errno.ENOMEM)}); "
                                      "free memory (or raise the limit, ulimit -v) and re-run") from None
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
