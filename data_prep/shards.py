"""Arrow IPC file shards: the row schema, a size-bounded writer with atomic renames, and file hashing.

Each shard holds one record batch, so a reader gets every column as one contiguous buffer:
`pyarrow.ipc.open_file(pyarrow.memory_map(path)).get_batch(0)` and then zero-copy numpy views.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from data_prep.encode import EncodedChunk
from ptm.files import sha256_file

SHARD_SUFFIX = ".arrow"
_FILE_OVERHEAD = 4096  # IPC magic, schema, footer and 64-byte buffer padding
COLUMNS = {
    "input_ids": "token ids of the whole document (uint16 when the vocabulary fits, else int32)",
    "sentence_starts": "token index where each sentence starts (first is 0); empty with --structure none",
    "word_start": "one byte per token: 1 where the token begins a word (whole-word masking); empty below "
                  "--structure words",
    "phrase_spans": "flattened [start, end) token pairs of multi-word phrases (ERNIE phrase masking); empty below "
                    "--structure full",
    "entity_spans": "flattened [start, end) token pairs of dictionary entities (ERNIE entity masking); empty "
                    "below --structure full",
    "doc_hash": "63-bit hash of the normalised text (exact de-duplication)",
    "source_file": "index into manifest['sources'] of the input file",
    "source_line": "line (text, JSONL) or row (Parquet, Arrow) where the document starts in that file",
    "pair_start": "token index of a labelled pair's segment B (its second field), else of the second paragraph; "
                  "0 if none",
    "label": "class id of a labelled example (--label-field); -1 if none",
}


_NUMPY = {pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.int32(): np.int32, pa.int64(): np.int64}


def token_type(vocab_size: int) -> pa.DataType:
    return pa.uint16() if vocab_size <= 1 << 16 else pa.int32()


def schema(vocab_size: int) -> pa.Schema:
    i32 = pa.list_(pa.int32())
    return pa.schema([
        ("input_ids", pa.list_(token_type(vocab_size))),
        ("sentence_starts", i32),
        ("word_start", pa.list_(pa.uint8())),
        ("phrase_spans", i32),
        ("entity_spans", i32),
        ("doc_hash", pa.int64()),
        ("source_file", pa.int32()),
        ("source_line", pa.int64()),
        ("pair_start", pa.int32()),
        ("label", pa.int64()),
    ], metadata={"ptm.format": "ptm-arrow-v1"})


def _take(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, lengths) of the ragged rows `rows` (ascending) of (values, offsets)."""
    starts, ends = offsets[rows], offsets[rows + 1]
    if not len(rows):
        return values[:0], ends - starts
    cut = np.flatnonzero(np.diff(rows) != 1) + 1  # rows that do not follow the one before: one slice per run
    first, last = np.append(0, cut), np.append(cut, len(rows)) - 1
    return np.concatenate([values[a:b] for a, b in zip(starts[first].tolist(), ends[last].tolist())]), ends - starts


# pyarrow's numpy conversions (`pa.array`, `to_numpy`) import pandas when it is installed, 0.4 s per process;
# a build converts through the buffers instead.

def _arrow(values: np.ndarray) -> pa.Array:
    """A numpy array as an Arrow array."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def to_numpy(arr: pa.Array) -> np.ndarray:
    """A fixed-width Arrow array without nulls (a shard's scalar column) as a zero-copy numpy view."""
    dtype = np.dtype(_NUMPY[arr.type])
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _list_array(parts: list[tuple[np.ndarray, np.ndarray]], dtype: pa.DataType) -> pa.Array:
    """A list array from (values, lengths) parts."""
    offsets = np.zeros(sum(len(n) for _, n in parts) + 1, dtype=np.int32)
    np.cumsum(np.concatenate([n for _, n in parts]), out=offsets[1:])
    values = np.concatenate([v for v, _ in parts]).astype(_NUMPY[dtype], copy=False)
    return pa.ListArray.from_arrays(_arrow(offsets), _arrow(values))


def write_table_atomic(path: str, table_or_batch, schema_: pa.Schema) -> dict:
    """Write one record batch to `path` via a temporary file, fsync and rename; return its shard entry."""
    batch = table_or_batch
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else pa.RecordBatch.from_pylist([], schema_)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, schema_) as writer:
            writer.write_batch(batch)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:  # (a full disk: what was written of it goes)
        if os.path.lexists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError) and e.errno and not e.filename:  # (pyarrow's names no file)
            raise OSError(e.errno, os.strerror(e.errno), path) from e
        raise
    return shard_entry(path, batch)


def shard_entry(path: str, batch: pa.RecordBatch) -> dict:
    """The manifest entry of the shard at `path`, which holds `batch`."""
    ids = batch.column("input_ids")
    return {
        "file": os.path.basename(path),
        "num_documents": batch.num_rows,
        "num_tokens": len(ids.values) if batch.num_rows else 0,
        "num_sentences": len(batch.column("sentence_starts").values) if batch.num_rows else 0,
        "bytes": os.path.getsize(path),
        "sha256": sha256_file(path),
    }


class ShardWriter:
    """Collects documents of encoded chunks into shards of at most `max_bytes`; the caller flushes when
    `full_for(size)`. Documents are kept as (chunk, rows) and gathered with a few numpy calls per chunk."""

    def __init__(self, directory: str, prefix: str, vocab_size: int, max_bytes: int, first_index: int = 0):
        self.directory, self.prefix, self.max_bytes = directory, prefix, max_bytes
        self.schema = schema(vocab_size)
        self._ids_type = token_type(vocab_size)
        self._id_bytes = 2 if self._ids_type == pa.uint16() else 4
        self.index = first_index
        self._reset()

    def _reset(self):
        self.parts: list[tuple[EncodedChunk, np.ndarray]] = []
        self.sources: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # file index, line, label per part
        self.bytes = _FILE_OVERHEAD

    def sizes(self, chunk: EncodedChunk) -> np.ndarray:
        """Bytes each document of `chunk` adds to a shard file: its values plus five list offsets and three
        scalars."""
        n = {name: np.diff(off) for name, (_, off) in chunk.ragged().items()}
        return (n["input_ids"] * self._id_bytes + n["word_start"] + 52
                + 4 * (n["sentence_starts"] + n["phrase_spans"] + n["entity_spans"]))

    def full_for(self, size: int) -> bool:
        """True when a document of `size` bytes does not fit: flush first. A document larger than a shard
        gets its own."""
        return bool(self.sources) and self.bytes + size > self.max_bytes

    def fitting(self, sizes: np.ndarray) -> int:
        """How many of the next documents, of `sizes` bytes, fit in this shard (at least one)."""
        return max(1, int(np.searchsorted(self.bytes + np.cumsum(sizes), self.max_bytes, side="right")))

    def add(self, chunk: EncodedChunk, rows: np.ndarray, size: int, source_file: np.ndarray, source_line: np.ndarray,
            label: np.ndarray) -> None:
        """Add documents `rows` (ascending, after those of `chunk` added before) of `chunk`, `size` bytes in all,
        with each one's source file index, line and label."""
        self.parts.append((chunk, rows))
        self.sources.append((source_file, source_line, label))
        self.bytes += size

    def flush(self) -> dict | None:
        if not self.sources:
            return None
        parts = [(chunk.ragged(), chunk, rows) for chunk, rows in self.parts]
        lists = [_list_array([_take(*ragged[name], rows) for ragged, _, rows in parts], dtype)
                 for name, dtype in (("input_ids", self._ids_type), ("sentence_starts", pa.int32()),
                                     ("word_start", pa.uint8()), ("phrase_spans", pa.int32()),
                                     ("entity_spans", pa.int32()))]
        src = [np.concatenate(column) for column in zip(*self.sources)]
        batch = pa.RecordBatch.from_arrays([
            *lists,
            _arrow(np.concatenate([chunk.hashes[rows] for _, chunk, rows in parts])),
            _arrow(src[0].astype(np.int32)),
            _arrow(src[1].astype(np.int64)),
            _arrow(np.concatenate([chunk.pair_start[rows] for _, chunk, rows in parts]).astype(np.int32)),
            _arrow(src[2].astype(np.int64)),
        ], schema=self.schema)
        path = os.path.join(self.directory, f"{self.prefix}-{self.index:05d}{SHARD_SUFFIX}")
        entry = write_table_atomic(path, batch, self.schema)
        self.index += 1
        self._reset()
        return entry
