"""Small helpers for dataset tests (bench/index_build.py uses `wikipedia_like_shapes` too)."""
from __future__ import annotations

import numpy as np

from data_prep.build import BuildOptions, build
from data_prep.dataset import Corpus

COLUMNS = ("tokens", "sentence_starts", "word_start", "phrase_spans", "entity_spans")


def quick_build(inputs, out, **kw):
    """Build in-process with test-friendly defaults; returns the manifest."""
    kw.setdefault("progress", False)
    return build(BuildOptions(inputs=[str(i) for i in inputs], out=str(out), **kw))


def contents(path) -> list[tuple]:
    """Every document's stored arrays, in order, as plain tuples (shard layout does not matter)."""
    c = Corpus(str(path))
    return [tuple(getattr(c, col)(i).tolist() for col in COLUMNS) for i in range(len(c))]


def wikipedia_like_shapes(seed: int = 0):
    """Fake lengths of ~100M tokens shaped like a Wikipedia shard set (120,000 documents, lognormal sentence
    counts, geometric sentence lengths): (sentence offsets per document, sentence starts within their document,
    sentence lengths, document lengths), as index maps take them from a dataset."""
    g = np.random.default_rng(seed)
    counts = np.maximum(1, g.lognormal(3, 1, 120_000).astype(np.int64))
    lengths = np.maximum(1, g.geometric(1 / 25, counts.sum()))
    offsets = np.concatenate([[0], np.cumsum(counts)])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    local = (starts - np.repeat(starts[offsets[:-1]], counts)).astype(np.int32)
    return offsets, local, lengths, np.add.reduceat(lengths, offsets[:-1])


def run_at_init(cfg, tok_dir, out, step: int = 7, nfkc: bool = True):
    """A ptm run directory OUT/run whose latest checkpoint holds the model of ModelConfig `cfg` as initialised (seed 0)
    with the tokenizer `tok_dir`; returns (the model, the run directory)."""
    import os

    import torch

    from pretrain import checkpoint as C
    from pretrain import models

    torch.manual_seed(0)
    model = models.build(cfg).eval()
    run = os.path.join(str(out), "run")
    ckpt = os.path.join(run, "checkpoints", f"step_{step:08d}")
    os.makedirs(ckpt)
    C.save_model(ckpt, model.state_dict())
    C.copy_tokenizer(tok_dir, ckpt)
    C.write_meta(ckpt, model=cfg, params=C.param_info(model.named_parameters()), step=step, extra={"nfkc": nfkc})
    C.mark_latest(run, os.path.basename(ckpt))
    return model, run
