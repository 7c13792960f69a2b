"""Arrow IPC file shards: the row schema, a size-bounded writer with atomic renames, and file hashing.

Each shard holds one record batch, so a reader gets every column as one contiguous buffer:
`pyarrow.ipc.open_file(pyarrow.memory_map(path)).get_batch(0)` and then zero-copy numpy views.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from data_prep.encode import EncodedDoc
from ptm.files import sha256_file

SHARD_SUFFIX = ".arrow"
_FILE_OVERHEAD = 4096  # IPC magic, schema, footer and 64-byte buffer padding
COLUMNS = {
    "input_ids": "token ids of the whole document (uint16 when the vocabulary fits, else int32)",
    "sentence_starts": "token index where each sentence starts (first is 0)",
    "word_start": "one byte per token: 1 where the token begins a word (whole-word masking)",
    "phrase_spans": "flattened [start, end) token pairs of multi-word phrases (ERNIE phrase masking)",
    "entity_spans": "flattened [start, end) token pairs of dictionary entities (ERNIE entity masking)",
    "doc_hash": "63-bit hash of the normalised text (exact de-duplication)",
    "source_file": "index into manifest['sources'] of the input file",
    "source_line": "line (text, JSONL) or row (Parquet, Arrow) where the document starts in that file",
    "pair_start": "token index where the second paragraph starts (segment B of a labelled pair); 0 if none",
    "label": "class id of a labelled example (--label-field); -1 if none",
}


_NUMPY = {pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.int32(): np.int32}


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


def _list_array(parts: list[np.ndarray], dtype: pa.DataType) -> pa.Array:
    lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    offsets = np.zeros(len(parts) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(parts) if parts else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.astype(_NUMPY[dtype], copy=False)))


def write_table_atomic(path: str, table_or_batch, schema_: pa.Schema) -> dict:
    """Write one record batch to `path` via a temporary file, fsync and rename; return its shard entry."""
    batch = table_or_batch
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else pa.RecordBatch.from_pylist([], schema_)
    tmp = f"{path}.tmp{os.getpid()}"
    with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, schema_) as writer:
        writer.write_batch(batch)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
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
    """Collects documents into shards of at most `max_bytes`; the caller flushes when `full_for(doc)`."""

    def __init__(self, directory: str, prefix: str, vocab_size: int, max_bytes: int, first_index: int = 0):
        self.directory, self.prefix, self.max_bytes = directory, prefix, max_bytes
        self.schema = schema(vocab_size)
        self._ids_type = token_type(vocab_size)
        self._id_bytes = 2 if self._ids_type == pa.uint16() else 4
        self.index = first_index
        self._reset()

    def _reset(self):
        self.docs: list[EncodedDoc] = []
        self.sources: list[tuple[int, int, int]] = []
        self.bytes = _FILE_OVERHEAD

    def _size(self, doc: EncodedDoc) -> int:
        """Bytes a document adds to the shard file: its values plus five list offsets and three scalars."""
        return (len(doc.input_ids) * (self._id_bytes + 1) + 52
                + 4 * (len(doc.sentence_starts) + len(doc.phrase_spans) + len(doc.entity_spans)))

    def full_for(self, doc: EncodedDoc) -> bool:
        """True when `doc` does not fit: flush first. A document larger than a shard gets its own."""
        return bool(self.docs) and self.bytes + self._size(doc) > self.max_bytes

    def add(self, doc: EncodedDoc, source_file: int, source_line: int, label: int = -1) -> None:
        self.docs.append(doc)
        self.sources.append((source_file, source_line, label))
        self.bytes += self._size(doc)

    def flush(self) -> dict | None:
        if not self.docs:
            return None
        d = self.docs
        src = np.asarray(self.sources, dtype=np.int64).reshape(-1, 3)
        batch = pa.RecordBatch.from_arrays([
            _list_array([x.input_ids for x in d], self._ids_type),
            _list_array([x.sentence_starts for x in d], pa.int32()),
            _list_array([x.word_start for x in d], pa.uint8()),
            _list_array([x.phrase_spans for x in d], pa.int32()),
            _list_array([x.entity_spans for x in d], pa.int32()),
            pa.array(np.fromiter((x.doc_hash for x in d), dtype=np.int64, count=len(d))),
            pa.array(src[:, 0].astype(np.int32)),
            pa.array(src[:, 1]),
            pa.array(np.fromiter((x.pair_start for x in d), dtype=np.int32, count=len(d))),
            pa.array(src[:, 2]),
        ], schema=self.schema)
        path = os.path.join(self.directory, f"{self.prefix}-{self.index:05d}{SHARD_SUFFIX}")
        entry = write_table_atomic(path, batch, self.schema)
        self.index += 1
        self._reset()
        return entry
