"""Index maps over a dataset (document order, sample index, shuffle, blending), vectorised numpy, cached.

Every random choice draws from `rng(stream, seed, *keys)` with no global state, so each map is a pure
function of the dataset, its parameters and the seed. `IndexCache` builds each map once and keeps it as
`DATASET/.ptm_index/<name>-<hash>.npy` (the hash covers the parameters and the shards' sha256s), written
atomically and mapped back with `np.load(mmap_mode="r")`.
"""
from __future__ import annotations

import contextlib
import enum
import errno
import hashlib
import json
import os
import tempfile
import warnings
from typing import Callable

import numpy as np

INDEX_VERSION = 1  # bump when a builder below changes what it returns


class Stream(enum.IntEnum):
    """Independent random streams; each is always seeded with the same number of keys."""
    DOC_ORDER = 1  # (seed, epoch)
    SHUFFLE = 2  # (seed, epoch)
    CHUNKS = 3  # (seed,)
    SAMPLE = 4  # (seed, epoch, index)


def rng(stream: Stream, seed: int, *keys: int) -> np.random.Generator:
    """A generator for (stream, seed, keys...); all must be non-negative integers."""
    return np.random.default_rng([int(stream), int(seed), *map(int, keys)])


class IndexCache:
    """Index maps of one dataset directory, stored under DIR/.ptm_index or, where that is not writable,
    under `cache_dir`; without either the map is kept in memory (and rebuilt by every process)."""

    def __init__(self, dataset_dir: str, manifest: dict, cache_dir: str | None = None):
        self.dirs = [os.path.join(dataset_dir, ".ptm_index")] + ([cache_dir] if cache_dir else [])
        shards = [s["sha256"] for s in manifest["shards"]]
        self._base = json.dumps({"version": INDEX_VERSION, "shards": shards})

    def filename(self, name: str, params: dict) -> str:
        digest = hashlib.sha256((self._base + json.dumps(params, sort_keys=True)).encode()).hexdigest()
        return f"{name}-{digest[:20]}.npy"

    def get(self, name: str, params: dict, build: Callable[[], np.ndarray]) -> np.ndarray:
        """The cached map for (name, params), built with `build()` the first time."""
        file = self.filename(name, params)
        for d in self.dirs:
            if os.path.isfile(os.path.join(d, file)):
                try:
                    return _map(os.path.join(d, file))
                except ValueError:  # cut short (an older ptm on a full disk): built again
                    with contextlib.suppress(OSError):
                        os.remove(os.path.join(d, file))
        array = np.ascontiguousarray(build())
        for d in self.dirs:
            try:
                os.makedirs(d, exist_ok=True)
                _save_atomic(os.path.join(d, file), array)
            except OSError:
                continue
            return _map(os.path.join(d, file))
        warnings.warn(f"index {file} is kept in memory: none of {', '.join(self.dirs)} is writable "
                      "(give a writable cache_dir)", stacklevel=2)
        return array


def _map(path: str) -> np.ndarray:
    """The stored map, memory-mapped read-only (a plain ndarray view: np.memmap indexing is slower)."""
    return np.load(path, mmap_mode="r").view(np.ndarray)


def _save_atomic(path: str, array: np.ndarray) -> None:
    """Write to a unique temporary file, fsync and rename, so that a reader never maps a partial file and
    ranks on several nodes building the same map at once do not collide."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, array)
            f.flush()
            os.fsync(f.fileno())
            if os.fstat(f.fileno()).st_size != f.tell():  # (numpy's write to a full disk can stop short silently)
                raise OSError(errno.ENOSPC, "the file was cut short", tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the dataset's readers need it
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# ------------------------------------------------------------------------------------------ builders

def _index_dtype(n: int):
    return np.uint32 if n < 1 << 32 else np.int64


def shuffle(n: int, stream: Stream, seed: int, epoch: int) -> np.ndarray:
    """A seeded permutation of range(n), uint32 where it fits."""
    return rng(stream, seed, epoch).permutation(n).astype(_index_dtype(n))


def stream_order(windows: int, streams: int) -> np.ndarray:
    """Sample i -> window for `streams` streams that each walk a contiguous run of the windows: sample i is step
    i // streams of stream i % streams, window (i % streams) * T + i // streams, T = windows // streams (the
    remainder is left out). A recurrent model's memory (Transformer-XL, XLNet) carries stream k's state from one
    step to its next window."""
    steps = windows // streams
    i = np.arange(steps * streams, dtype=np.int64)
    return ((i % streams) * steps + i // streams).astype(_index_dtype(max(windows, 1)))


def split_documents(num_docs: int, valid_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, valid) document ids: a document is held out when a seeded 64-bit hash of its index falls
    below `valid_fraction`, so the split never depends on the other documents (appending keeps it)."""
    key = _mix64(np.full(1, seed, dtype=np.uint64))
    u = (_mix64(np.arange(num_docs, dtype=np.uint64) ^ key) >> np.uint64(11)) * 2.0 ** -53
    valid = u < valid_fraction
    return np.flatnonzero(~valid), np.flatnonzero(valid)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (uint64 arrays wrap around silently)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def windows(lengths: np.ndarray, seq_len: int, stride: int | None = None) -> np.ndarray:
    """GPT sample index: documents of these lengths, in this order, each followed by an end-of-document
    token form one stream; window i is its tokens [i * stride, i * stride + seq_len + 1) (stride: seq_len unless
    given), as many as fit. Returns (n, 2) int64 [document position, offset in the document] of each window's first
    token."""
    stride = stride or seq_len
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths + 1)
    n = max(0, (int(ends[-1]) - seq_len - 1) // stride + 1) if len(ends) else 0
    first = np.arange(n, dtype=np.int64) * stride
    doc = np.searchsorted(ends, first, side="right")
    return np.stack([doc, first - (ends[doc] - lengths[doc] - 1)], axis=1)


def document_windows(lengths: np.ndarray, seq_len: int) -> np.ndarray:
    """GPT sample index without packing: each document followed by its end-of-document token on its own,
    cut into windows that start every seq_len tokens while a next token is left to predict. Returns (n, 2)
    int64 [document position, offset in the document]."""
    lengths = np.asarray(lengths, dtype=np.int64)
    counts = -(-lengths // seq_len)  # windows starting at 0, seq_len, ... below the document's length
    doc = np.repeat(np.arange(len(lengths)), counts)
    first = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.stack([doc, first * seq_len], axis=1)


def sentence_table(offsets: np.ndarray, starts: np.ndarray, lengths: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """The sentences of documents `docs`, in that order, from the ragged `sentence_starts` column (`offsets`
    into `starts`, per corpus document) and the documents' lengths: (3, S) int32 rows [document position in
    `docs`, first token, end token]; row 0 is sorted, so a document's sentences are a searchsorted away."""
    lo = offsets[docs]
    counts = offsets[docs + 1] - lo
    first_of_doc = np.concatenate([[0], np.cumsum(counts)])
    total = int(first_of_doc[-1])
    first = starts[np.arange(total) + np.repeat(lo - first_of_doc[:-1], counts)].astype(np.int64)
    end = np.empty_like(first)
    end[:-1] = first[1:]
    has = counts > 0
    end[first_of_doc[1:][has] - 1] = lengths[docs][has]
    return np.stack([np.repeat(np.arange(len(docs)), counts), first, end]).astype(np.int32)


def chain(nxt: np.ndarray) -> np.ndarray:
    """[0, nxt[0], nxt[nxt[0]], ...] (the values below n = len(nxt)) for a successor map with
    i < nxt[i] <= n: the starts of a greedy segmentation, by pointer doubling in O(n log(chain length))."""
    n = len(nxt)
    jump = np.append(np.asarray(nxt, dtype=np.int64), n)
    on = np.zeros(n + 1, dtype=bool)
    on[0] = True
    while True:  # round j: `on` holds the first 2**j links, `jump` goes 2**j links ahead
        at = np.flatnonzero(on[:n])
        ahead = jump[at]
        if (ahead == n).all():
            return at
        on[ahead] = True
        jump = jump[jump]


def pair_chunks(sentences: np.ndarray, max_tokens: int, short_seq_prob: float, seed: int) -> np.ndarray:
    """Runs of whole sentences within each document for sentence-pair samples, as BERT's
    create_instances_from_document: a run grows until it holds its target length (max_tokens, or with
    probability short_seq_prob a uniform 2..max_tokens) or its document ends, and holds two sentences at
    least where the document has them. `sentences` is a `sentence_table`. Runs under two tokens are
    dropped. Returns (C, 3) int64 [first sentence, end sentence, target length]."""
    doc, first, end = (np.asarray(r, dtype=np.int64) for r in sentences)
    s = len(doc)
    cum = np.concatenate([[0], np.cumsum(end - first)])
    g = rng(Stream.CHUNKS, seed)
    target = np.where(g.random(s) < short_seq_prob, g.integers(2, max_tokens + 1, s), max_tokens)
    doc_end = np.searchsorted(doc, doc, side="right")
    hi = np.searchsorted(cum, cum[:-1] + target, side="left")
    hi = np.minimum(np.maximum(hi, np.arange(s) + 2), doc_end)
    lo = chain(hi)
    lo = lo[cum[hi[lo]] - cum[lo] >= 2]
    return np.stack([lo, hi[lo], target[lo]], axis=1)


def packed_chunks(sentences: np.ndarray, max_tokens: int) -> np.ndarray:
    """RoBERTa's FULL-SENTENCES: greedy runs of whole sentences, crossing document boundaries (one
    separator token each), of at most max_tokens; a longer sentence is a run of its own. Returns (C, 3)
    int64 [first sentence, end sentence, max_tokens]."""
    doc, first, end = (np.asarray(r, dtype=np.int64) for r in sentences)
    s = len(doc)
    starts_doc = np.ones(s, dtype=np.int64)
    starts_doc[1:] = doc[1:] != doc[:-1]
    cum = np.concatenate([[0], np.cumsum(end - first + starts_doc)])
    hi = np.searchsorted(cum, cum[:-1] + starts_doc + max_tokens, side="right") - 1
    hi = np.maximum(hi, np.arange(s) + 1)
    lo = chain(hi)
    return np.stack([lo, hi[lo], np.full(len(lo), max_tokens)], axis=1)


def quotas(weights, size: int) -> np.ndarray:
    """Samples per dataset: `size` split by `weights` with the largest remainders rounded up."""
    w = np.asarray(weights, dtype=np.float64)
    raw = w / w.sum() * size
    q = np.floor(raw).astype(np.int64)
    q[np.argsort(q - raw, kind="stable")[: size - q.sum()]] += 1
    return q


def blend(weights, size: int) -> np.ndarray:
    """Megatron's BlendedDataset index without its sequential loop: (size, 2) int64 [dataset, sample in
    it]. Dataset d holds exactly its quota n_d and its k-th sample sits at the rank of the time
    (k + 1/2) / n_d among all datasets' times (ties: lower d first), so every prefix of the blend holds
    each dataset's share to within one sample. Ranks are counted in closed form, O(size * datasets)."""
    q = quotas(weights, size)
    out = np.empty((size, 2), dtype=np.int64)
    for d, n_d in enumerate(q):
        k = np.arange(n_d, dtype=np.int64)
        rank = k.copy()
        for e, n_e in enumerate(q):
            if e == d:
                continue
            x = (2 * k + 1) * n_e  # dataset e's sample k' comes first when (2k'+1) * n_d < x (<= for e < d)
            rank += np.minimum((x // n_d + 1) // 2 if e < d else -(-x // n_d) // 2, n_e)
        out[rank, 0], out[rank, 1] = d, k
    return out
