"""ptm checkpoints: one directory per step, in a layout-free form, with a `latest` pointer written last.

    OUT_DIR/checkpoints/latest                 text: the name of the newest complete checkpoint
    OUT_DIR/checkpoints/step_00000100/
        meta.json                              format, step, model config, the layout it was written from
                                               (tp, dp, zero stage), every parameter's full shape and split dim
        shards/{kind}-tpTT-dpDDD.safetensors   pieces of fp32 tensors, kind = param | exp_avg | exp_avg_sq
        trainer.pt                             LR schedule, loss scaler, step, data position (when training)
        rng/rankRRRRR.pt                       each process's RNG states (when training)
        config.yaml                            the resolved training config
        tokenizer/                             the dataset's tokenizer (ptm_tokenizer.json + files)

A piece is stored under `NAME@START`: elements START.. of the flattened TP shard NAME of TP rank TT. Each
process writes the pieces it owns (its ZeRO partition of its TP shard), so saving needs no gathering and
any layout can read any other: `Pieces` reassembles a whole parameter, or another TP size's shard of it.
A consolidated checkpoint (tp=1, dp=1) holds every parameter as one piece `NAME@0` with its shape, and is
readable by any safetensors tool.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pretrain.models.config import ModelConfig
from ptm.files import write_json, write_text

FORMAT = "ptm-checkpoint"
VERSION = 2
LATEST = "latest"
KINDS = ("param", "exp_avg", "exp_avg_sq")  # weights (fp32 master copies) and the Adam/LAMB moments
# the dimension megatron-core splits each tensor-parallel parameter along (everything else is replicated)
SPLIT_DIM = {"attn.qkv.weight": 0, "attn.qkv.bias": 0, "mlp.fc1.weight": 0, "mlp.fc1.bias": 0,
             "attn.out.weight": 1, "mlp.fc2.weight": 1, "embeddings.word.weight": 0, "mlm.bias": 0}


class CheckpointError(Exception):
    """A missing, incomplete or mismatched checkpoint; the message names it and the fix."""


def resolve(path: str) -> str:
    """A checkpoint directory, or a run's out_dir (its latest checkpoint)."""
    if os.path.isfile(os.path.join(path, "meta.json")):
        return path
    pointer = os.path.join(path, "checkpoints", LATEST)
    if os.path.isfile(pointer):
        with open(pointer) as f:
            return os.path.join(path, "checkpoints", f.read().strip())
    raise CheckpointError(f"{path} is neither a ptm checkpoint (no meta.json) nor a run directory with "
                          f"checkpoints/{LATEST}; pass a checkpoint directory or a training out_dir")


def read_meta(ckpt: str) -> dict:
    try:
        with open(os.path.join(ckpt, "meta.json")) as f:
            meta = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{ckpt}/meta.json is unreadable ({e}); use another checkpoint") from None
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise CheckpointError(f"{ckpt}/meta.json is not a {FORMAT} v{VERSION} file; convert it with this ptm version")
    return meta


def model_config(meta: dict) -> ModelConfig:
    return ModelConfig(**meta["model"])


def shard_path(ckpt: str, kind: str, tp_rank: int, dp_rank: int) -> str:
    return os.path.join(ckpt, "shards", f"{kind}-tp{tp_rank:02d}-dp{dp_rank:03d}.safetensors")


def write_pieces(ckpt: str, kind: str, tp_rank: int, dp_rank: int, pieces: dict[str, torch.Tensor]) -> None:
    """One shard file of `NAME@START` pieces (fp32), written under a temporary name and renamed."""
    path = shard_path(ckpt, kind, tp_rank, dp_rank)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_file({k: v.detach().float().contiguous().cpu() for k, v in pieces.items()}, path + ".tmp")
    os.replace(path + ".tmp", path)


def save_model(ckpt: str, state: dict[str, torch.Tensor]) -> None:
    """Whole fp32 weights as a consolidated (tp=1) checkpoint's parameter file (non-tensor entries, such as
    megatron-core's `_extra_state`, are not weights and are dropped)."""
    write_pieces(ckpt, "param", 0, 0, {f"{k}@0": v for k, v in state.items() if isinstance(v, torch.Tensor)})


def write_meta(ckpt: str, *, model: ModelConfig, params: dict[str, dict], tp: int = 1, dp: int = 1,
               step: int = 0, extra: dict | None = None) -> None:
    """`params`: name -> {"shape": full shape, "split_dim": dim split over TP ranks or None}."""
    from ptm import __version__

    meta = {"format": FORMAT, "version": VERSION, "ptm_version": __version__, "step": step, "tp": tp, "dp": dp,
            "model": dataclasses.asdict(model), "params": params, **(extra or {})}
    write_json(os.path.join(ckpt, "meta.json"), meta)


def split_dim(name: str) -> int | None:
    return next((d for suffix, d in SPLIT_DIM.items() if name.endswith(suffix)), None)


def param_info(shapes: dict[str, tuple], tp: int = 1) -> dict[str, dict]:
    """meta.json's `params` from the parameter shapes of TP rank 0 of `tp`."""
    info = {}
    for name, shape in shapes.items():
        shape, dim = list(shape), split_dim(name)
        if dim is not None:
            shape[dim] *= tp
        info[name] = {"shape": shape, "split_dim": dim}
    return info


def copy_tokenizer(src_dir: str, ckpt: str) -> None:
    dst = os.path.join(ckpt, "tokenizer")
    if os.path.abspath(src_dir) != os.path.abspath(dst):
        shutil.copytree(src_dir, dst, dirs_exist_ok=True)


def mark_latest(out_dir: str, name: str) -> None:
    """Point `latest` at a finished checkpoint (atomic rename: readers never see a partial pointer)."""
    write_text(os.path.join(out_dir, "checkpoints", LATEST), name + "\n")


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
        if name in ("embeddings.word.weight", "mlm.bias") and t.shape[0] < vocab_rows:
            t = torch.cat([t, t.new_zeros(vocab_rows - t.shape[0], *t.shape[1:])])
        out[name] = t if info["split_dim"] is None else t.chunk(tp, dim=info["split_dim"])[tp_rank].contiguous()
    return out
