"""Consolidate or reshard a checkpoint of any layout (any TP size, DP size and ZeRO stage) without launching
processes: pieces are read memory-mapped, one parameter at a time, and each output file holds one TP shard of
one kind (weights, first moments, second moments), so memory stays around one model copy at most."""
from __future__ import annotations

import contextlib
import os
import shutil

from pretrain import checkpoint as C
from pretrain import families
from pretrain.models.recurrence import DIRECTORY as MEMORY
from ptm.files import copy_file, copy_tree


def reshard(src: str, out: str, tp: int = 1, weights_only: bool = False) -> str:
    """Write `src` (a checkpoint or run directory) to `out` with `tp` tensor-parallel shards and no ZeRO
    partitioning (tp=1: the consolidated form, whole tensors with their shapes). Returns `out`."""
    ckpt = C.check_complete(C.resolve(src))
    pieces = C.Pieces(ckpt)
    m = C.model_config(pieces.meta)
    sizes = {"model.num_heads": m.num_heads, "model.ffn_hidden_size": m.ffn_hidden_size,
             "the padded vocabulary": m.padded_vocab}
    for c in families.get(m.arch).cost.companions(m):  # models trained beside it (ELECTRA's generator)
        sizes.update({"the companion model's num_heads": c.num_heads, "its ffn_hidden_size": c.ffn_hidden_size})
    odd = [f"{k}={v}" for k, v in sizes.items() if tp < 1 or v % tp]
    if odd:
        raise C.CheckpointError(f"cannot split this model into tp={tp} shards ({', '.join(odd)} not divisible); "
                                f"choose a --tp that divides {', '.join(sizes)}")
    with fresh(out) as tmp:
        kinds = [k for k in C.KINDS if pieces.has(k) and (k == "param" or not weights_only)]
        for kind in kinds:
            for rank in range(tp):
                C.write_pieces(tmp, kind, rank, 0,
                               {f"{name}@0": pieces.shard(kind, name, rank, tp) for name in pieces.params})
        for item in ("trainer.pt", "config.yaml", "tokenizer", MEMORY):  # a memory file holds whole streams: any layout
            path = os.path.join(ckpt, item)
            if os.path.isdir(path) and (item != MEMORY or not weights_only):
                copy_tree(path, os.path.join(tmp, item))
            elif os.path.isfile(path) and (item != "trainer.pt" or not weights_only):
                copy_file(path, os.path.join(tmp, item))
        meta = dict(pieces.meta, tp=tp, dp=1, zero_stage=0, resharded_from=os.path.abspath(ckpt))
        C.write_meta(tmp, model=C.model_config(meta), params=meta.pop("params"), tp=tp, dp=1, step=meta.pop("step"),
                     extra={k: v for k, v in meta.items() if k not in ("format", "version", "ptm_version", "tp", "dp",
                                                                        "model")})
    return out


@contextlib.contextmanager
def fresh(out: str):
    """Where a tool writes the checkpoint it puts at `out` (a new or empty directory): OUT.tmp, emptied of what a
    run cut short left there; when the block ends, the whole directory takes the name `out` (on an error it goes)."""
    if os.path.exists(os.path.join(out, "meta.json")):
        raise C.CheckpointError(f"{out} already holds a checkpoint; choose another --out or remove it")
    if os.path.isdir(out) and os.listdir(out):
        raise C.CheckpointError(f"{out} is a directory that is not empty; the checkpoint is written as a whole new "
                                "directory: choose another --out")
    tmp = out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        yield tmp
        if os.path.isdir(out) and not os.listdir(out):
            os.rmdir(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
