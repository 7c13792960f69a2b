"""Build time of the index maps for ~100M tokens (the shapes of a Wikipedia-sized shard set: 120,000
documents, lognormal sentence counts, geometric sentence lengths), next to a budget of 3 s per map so
that a run's start is not held up.

Run: `.venv/bin/python bench/index_build.py`. Fake lengths stand in for a dataset; nothing is cached.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

from pretrain.data.indexes import Stream, packed_chunks, pair_chunks, sentence_table, shuffle, windows

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import wikipedia_like_shapes  # noqa: E402  (the shapes test_data_indexes.py checks the maps on)

BUDGET_S = 3.0


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # no options: --help says what it times
    offsets, local, lengths, doc_lengths = wikipedia_like_shapes()
    counts = np.diff(offsets)
    print(f"{len(counts):,} documents, {len(lengths):,} sentences, {doc_lengths.sum():,} tokens")
    print(f"{'map':<32} | {'entries':>10} | {'s':>5} | {'s / budget':>10}")
    for name, build in [
        ("sentence table", lambda: sentence_table(offsets, local, doc_lengths, np.arange(len(counts)))),
        ("BERT pairs, seq 128", lambda: pair_chunks(table, 125, 0.1, seed=1)),
        ("RoBERTa full sentences, seq 128", lambda: packed_chunks(table, 126)),
        ("GPT order + windows, seq 1024",
         lambda: windows(doc_lengths[shuffle(len(counts), Stream.DOC_ORDER, 1, 0)], 1024)),
        ("shuffle of 1M samples", lambda: shuffle(1_000_000, Stream.SHUFFLE, 1, 0)),
    ]:
        start = time.perf_counter()
        result = build()
        seconds = time.perf_counter() - start
        if name == "sentence table":
            table = result
        entries = max(result.shape)  # the table is (3, S), the maps (n, k) or (n,)
        print(f"{name:<32} | {entries:>10,} | {seconds:>5.2f} | {seconds / BUDGET_S:>10.2f}")


if __name__ == "__main__":
    main()
