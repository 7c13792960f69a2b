"""Small helpers for dataset tests."""
from __future__ import annotations

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
