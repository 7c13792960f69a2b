"""ptm checkpoints: one directory per step, a `latest` pointer written last.

    OUT_DIR/checkpoints/latest                 text: the name of the newest complete checkpoint
    OUT_DIR/checkpoints/step_00000100/
        meta.json                              format, step, model config, tp size, ptm version
        model-tp00.safetensors ...             each TP rank's weights (fp32), readable by any safetensors tool
        trainer.pt                             optimizer, schedule, RNG and data position (when training)
        config.yaml                            the resolved training config
        tokenizer/                             the dataset's tokenizer (ptm_tokenizer.json + files)
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

from pretrain.models.config import ModelConfig
from ptm.files import write_json, write_text

FORMAT = "ptm-checkpoint"
VERSION = 1
LATEST = "latest"
# which dimension each tensor-parallel parameter is split along (everything else is replicated)
SPLIT_DIM = {"attn.qkv.weight": 0, "attn.qkv.bias": 0, "mlp.fc1.weight": 0, "mlp.fc1.bias": 0,
             "attn.out.weight": 1, "mlp.fc2.weight": 1, "embeddings.word.weight": 0, "mlm.bias": 0}


class CheckpointError(Exception):
    """A missing, incomplete or mismatched checkpoint; the message names it and the fix."""


def split_dim(key: str) -> int | None:
    return next((d for suffix, d in SPLIT_DIM.items() if key.endswith(suffix)), None)


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
    with open(os.path.join(ckpt, "meta.json")) as f:
        meta = json.load(f)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{ckpt}/meta.json is not a {FORMAT} file")
    return meta


def model_config(meta: dict) -> ModelConfig:
    return ModelConfig(**meta["model"])


def save_model(ckpt: str, state: dict[str, torch.Tensor], tp_rank: int = 0) -> None:
    tmp = os.path.join(ckpt, f".model-tp{tp_rank:02d}.tmp")
    tensors = {k: v.detach().float().contiguous().cpu() for k, v in state.items() if isinstance(v, torch.Tensor)}
    save_file(tensors, tmp)  # (megatron-core layers add non-tensor `_extra_state` entries: not weights)
    os.replace(tmp, os.path.join(ckpt, f"model-tp{tp_rank:02d}.safetensors"))


def write_meta(ckpt: str, *, model: ModelConfig, tp: int, step: int = 0, extra: dict | None = None) -> None:
    from ptm import __version__

    meta = {"format": FORMAT, "version": VERSION, "ptm_version": __version__, "step": step, "tp": tp,
            "model": dataclasses.asdict(model), **(extra or {})}
    write_json(os.path.join(ckpt, "meta.json"), meta)


def copy_tokenizer(src_dir: str, ckpt: str) -> None:
    dst = os.path.join(ckpt, "tokenizer")
    if os.path.abspath(src_dir) != os.path.abspath(dst):
        shutil.copytree(src_dir, dst, dirs_exist_ok=True)


def mark_latest(out_dir: str, name: str) -> None:
    """Point `latest` at a finished checkpoint (atomic rename: readers never see a partial pointer)."""
    write_text(os.path.join(out_dir, "checkpoints", LATEST), name + "\n")


def load_full_model(ckpt: str) -> dict[str, torch.Tensor]:
    """All TP shards of a checkpoint merged into one full state dict."""
    meta = read_meta(ckpt)
    shards = [load_file(os.path.join(ckpt, f"model-tp{r:02d}.safetensors")) for r in range(meta["tp"])]
    if len(shards) == 1:
        return shards[0]
    full = {}
    for key in shards[0]:
        dim = split_dim(key)
        full[key] = shards[0][key] if dim is None else torch.cat([s[key] for s in shards], dim=dim)
    return full


def load_model_shard(ckpt: str, tp_rank: int, tp: int, vocab_rows: int | None = None) -> dict[str, torch.Tensor]:
    """The weights TP rank `tp_rank` of `tp` holds, from a checkpoint of any TP size; `vocab_rows` pads the
    vocabulary (zero rows) to a larger model's padded size."""
    meta = read_meta(ckpt)
    if meta["tp"] == tp and vocab_rows is None:
        return load_file(os.path.join(ckpt, f"model-tp{tp_rank:02d}.safetensors"))
    full = load_full_model(ckpt)
    if vocab_rows is not None:
        for key in ("embeddings.word.weight", "mlm.bias"):
            if key in full and full[key].shape[0] < vocab_rows:
                t = full[key]
                full[key] = torch.cat([t, t.new_zeros(vocab_rows - t.shape[0], *t.shape[1:])])
    return {k: v if (d := split_dim(k)) is None else v.chunk(tp, dim=d)[tp_rank].contiguous()
            for k, v in full.items()}
