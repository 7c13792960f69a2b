"""Input discovery and streaming readers for text, JSONL (plain, .gz, .zst), Parquet and Arrow files.

Every reader yields `Record`s in file order. A record that cannot be read (invalid UTF-8, malformed
JSON, missing text field) is yielded with `error` set, so the caller decides to skip or fail and can
name the file and line.
"""
from __future__ import annotations

import codecs
import glob
import gzip
import io
import json
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from data_prep import PrepError

FORMATS = ("text", "jsonl", "parquet", "arrow")
_EXT = {
    ".txt": "text", ".text": "text", ".md": "text",
    ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl",
    ".parquet": "parquet", ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow",
}
_COMPRESSED = (".gz", ".zst")


class Problem(str):
    """Why a record is unreadable, "WHERE: WHAT", with `kind`: the reason without its location or details (what
    the skip counts count)."""

    def __new__(cls, where: str, what: str, kind: str | None = None):
        self = super().__new__(cls, f"{where}: {what}")
        self.at, self.kind = len(where), kind or what.split(" (")[0].split(";")[0]
        return self

    def __getnewargs__(self):
        return self[:self.at], self[self.at + 2:], self.kind


@dataclass
class Record:
    text: str | None
    file_index: int
    line: int  # 1-based line (text, JSONL) or row (Parquet, Arrow) where the record starts
    error: Problem | None = None
    label: int = -1  # class id of a labelled example (--label-field), -1 without
    pair_at: int = -1  # a labelled pair (--pair-field): where `text`'s blank line joining its two fields starts


@dataclass(frozen=True)
class Fields:
    """Which fields (JSONL, dotted paths) or columns (Parquet, Arrow) hold what."""

    text: str = "text"
    pair: str | None = None  # second text of a labelled pair, joined to the first by a blank line
    label: str | None = None  # integer class of a labelled example

    @property
    def plain(self) -> bool:
        """Only a top-level text field: a JSONL line needs nothing but its object's `text` (the common case)."""
        return self.pair is None and self.label is None and "." not in self.text

    def names(self) -> list[str]:
        return [f for f in (self.text, self.pair, self.label) if f]

    def record(self, values: dict, index: int, line: int, where: str) -> Record:
        """The record of a row's `values` by field name (a field the row lacks left out; None: null)."""
        for name in (self.text, self.pair):
            if name and not isinstance(v := values.get(name), str):
                flag = "--text-field" if name == self.text else "--pair-field"
                error = Problem(where, f"no field {name!r}; set {flag}") if name not in values else \
                    Problem(where, f"field {name!r} is null", "null field") if v is None else \
                    Problem(where, f"non-string field ({type(v).__name__}) {name!r}; set {flag}")
                return Record(None, index, line, error)
        label = values.get(self.label) if self.label else -1
        if not isinstance(label, int) or isinstance(label, bool) or label < (0 if self.label else -1):
            return Record(None, index, line, Problem(where, f"label {self.label!r} is {label!r}, not a class id "
                                                            "(0, 1, ...); fix the record or set --label-field",
                                                     "label not a class id"))
        text = values[self.text] + ("\n\n" + values[self.pair] if self.pair else "")
        return Record(text, index, line, label=label, pair_at=len(values[self.text]) if self.pair else -1)


def detect_format(path: str, forced: str | None) -> str | None:
    if forced:
        return forced
    stem = path[: -len(ext)] if (ext := os.path.splitext(path)[1]) in _COMPRESSED else path
    return _EXT.get(os.path.splitext(stem)[1].lower())


def _json_object(path: str) -> dict:
    """The JSON object in `path`; {} where it holds none."""
    try:
        with open(path, "rb") as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _saved_dataset(root: str, names: list[str]) -> list[str] | None:
    """The data files of a Hugging Face `datasets` save_to_disk folder (those its state.json lists, else its .arrow
    files beside dataset_info.json; none where dataset_dict.json leaves them to its splits' folders), or None."""
    saved = {n: _json_object(os.path.join(root, n)) for n in ("state.json", "dataset_dict.json") if n in names}
    files = saved.get("state.json", {}).get("_data_files")
    if isinstance(files, list) and all(isinstance(d, dict) and isinstance(d.get("filename"), str) for d in files):
        return [d["filename"] for d in files]
    if "splits" in saved.get("dataset_dict.json", {}):
        return []
    arrows = [n for n in names if n.endswith(".arrow")]
    return arrows if arrows and "dataset_info.json" in names else None


def expand_inputs(inputs: list[str], forced_format: str | None, out: str | None = None) -> list[str]:
    """Files named by paths, directories (recursively through links, each real directory once; known extensions
    only, neither hidden files nor the output directory `out` within them, of a Hugging Face `datasets` folder
    only its data files) and globs, in a stable order."""
    files: list[str] = []
    skip = os.path.realpath(out) if out else None

    def walk(top: str):
        seen = {os.path.realpath(top)}
        for root, dirs, names in os.walk(top, followlinks=True):
            kept = []
            for d in sorted(dirs, key=lambda d: (os.path.islink(os.path.join(root, d)), d)):  # real ones first
                real = os.path.realpath(os.path.join(root, d))
                if not d.startswith(".") and real != skip and real not in seen:
                    seen.add(real)
                    kept.append(d)
            dirs[:] = kept
            data = _saved_dataset(root, names)
            yield from (os.path.join(root, f) for f in (names if data is None else data) if not f.startswith("."))

    for item in inputs:
        if os.path.isdir(item):
            found = sorted(f for f in walk(item) if detect_format(f, forced_format) is not None)
            if not found:
                raise PrepError(f"input directory {item} holds no .txt/.jsonl/.parquet/.arrow files; "
                                "point at the files or pass --format")
            files += found
        elif os.path.isfile(item):
            files.append(item)
        elif any(c in item for c in "*?["):
            found = sorted(p for p in glob.glob(item, recursive=True)
                           if os.path.isfile(p) and not (skip and os.path.realpath(p).startswith(skip + os.sep)))
            if not found:
                raise PrepError(f"input glob {item!r} matches no files; check the pattern")
            files += found
        else:
            raise PrepError(f"input not found: {item}; check the path (directories and globs are accepted)")
    for f in files:
        if detect_format(f, forced_format) is None:
            raise PrepError(f"cannot tell the format of {f} from its extension; pass --format {'|'.join(FORMATS)}")
    return files


def _open_binary(path: str):
    """The file's bytes (decompressed), after a UTF-8 byte-order mark if it starts with one (Windows tools write
    one; it is no text)."""
    if path.endswith(".gz"):
        f = gzip.open(path, "rb")
    elif path.endswith(".zst"):
        f = io.BufferedReader(_Zstd(path))
    else:
        f = open(path, "rb")
    if f.peek(3)[:3] == codecs.BOM_UTF8:
        f.read(3)
    return f


class _Zstd(io.RawIOBase):
    """A .zst file's bytes, frame after frame. One that ends inside a frame raises EOFError, as gzip does for a
    truncated file (zstandard's readers end quietly there)."""

    def __init__(self, path: str):
        import zstandard

        self._new, self._file, self._error = zstandard.ZstdDecompressor().decompressobj, open(path, "rb"), \
            zstandard.ZstdError
        self._frame, self._inside, self._out, self._at = self._new(), False, b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._at == len(self._out):
            raw = self._file.read(1 << 17)
            if not raw:
                if self._inside:
                    raise EOFError("the file ends inside a zstd frame (truncated)")
                return 0
            out = []
            try:
                while raw:
                    out.append(self._frame.decompress(raw))
                    self._inside, raw = not self._frame.eof, b""
                    if self._frame.eof:
                        raw, self._frame = self._frame.unused_data, self._new()
            except self._error as e:  # not zstd, or damaged
                raise OSError(f"not a valid zstd file ({e})") from None
            self._out, self._at = memoryview(b"".join(out)), 0
        n = min(len(buffer), len(self._out) - self._at)
        buffer[:n] = self._out[self._at:self._at + n]
        self._at += n
        return n

    def close(self) -> None:
        self._file.close()
        super().close()


def _decode(raw: bytes, where: str) -> tuple[str | None, Problem | None]:
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as e:
        return None, Problem(where, f"invalid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})")


def _read_text(path: str, index: int, doc_boundary: str) -> Iterator[Record]:
    with _open_binary(path) as f:
        if doc_boundary == "file":
            text, err = _decode(f.read(), f"{path}:1")
            yield Record(text, index, 1, err)
            return
        block: list[bytes] = []
        start = 0
        for lineno, raw in enumerate(f, 1):
            blank = not raw.strip()
            if doc_boundary == "line":
                if not blank:
                    text, err = _decode(raw, f"{path}:{lineno}")
                    yield Record(text, index, lineno, err)
                continue
            if blank:
                if block:
                    text, err = _decode(b"".join(block), f"{path}:{start}")
                    yield Record(text, index, start, err)
                    block = []
            else:
                if not block:
                    start = lineno
                block.append(raw)
        if block:
            text, err = _decode(b"".join(block), f"{path}:{start}")
            yield Record(text, index, start, err)


_MISSING = object()


def _field(obj, dotted: str):
    for key in dotted.split("."):
        if not isinstance(obj, dict) or key not in obj:
            return _MISSING
        obj = obj[key]
    return obj


def _read_jsonl(path: str, index: int, fields: Fields) -> Iterator[Record]:
    with _open_binary(path) as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                yield parse_jsonl(line, path, index, lineno, fields)


def parse_jsonl(raw: bytes, path: str, index: int, lineno: int, fields: Fields) -> Record:
    """The record of one JSONL line: its fields, or the error that names the file and line."""
    if fields.plain:  # the common case, quickly
        try:
            obj = json.loads(raw.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError and JSONDecodeError: named below
            pass
        else:
            if type(obj) is dict and type(text := obj.get(fields.text)) is str:
                return Record(text, index, lineno)
    where = f"{path}:{lineno}"
    line, err = _decode(raw, where)
    if err:
        return Record(None, index, lineno, err)
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        return Record(None, index, lineno, Problem(where, f"malformed JSON ({e.msg}: column {e.colno})"))
    values = {name: v for name in fields.names() if (v := _field(obj, name)) is not _MISSING}
    return fields.record(values, index, lineno, where)


def _arrow_batches(path: str, columns: list[str], kind: str):
    """Batches of the `columns` of a Parquet or Arrow file, in that order; a dotted name (content.body) reaches a field
    of a struct column, as it does a nested JSON object's."""
    if kind == "parquet":
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
        batches = pf.iter_batches(columns=sorted({_top(c, schema.names) for c in columns} & set(schema.names)),
                                  batch_size=1024)
    else:
        source = pa.memory_map(path)
        try:
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            schema = reader.schema
        except pa.ArrowInvalid:  # Hugging Face `datasets` writes the IPC stream format
            source.seek(0)
            reader = pa.ipc.open_stream(source)
            batches, schema = reader, reader.schema
    missing = [c for c in columns if _type(schema, c) is None]
    if missing:
        raise PrepError(f"{path}: no column {missing[0]!r} (columns: {', '.join(schema.names)}); set --text-field, "
                        "--pair-field or --label-field")
    for batch in batches:
        yield [_column(batch, c) for c in columns]


def _top(name: str, names: list[str]) -> str:
    """The column that holds `name`: itself, or for a dotted name not a column, its first part."""
    return name if name in names else name.split(".")[0]


def _type(schema: pa.Schema, name: str) -> pa.DataType | None:
    """The type of column or struct field `name` (dotted) in `schema`; None where there is none."""
    top = _top(name, schema.names)
    if top not in schema.names:
        return None
    kind = schema.field(top).type
    for key in ([] if top == name else name.split(".")[1:]):
        if not pa.types.is_struct(kind) or kind.get_field_index(key) < 0:
            return None
        kind = kind.field(key).type
    return kind


def _column(batch: pa.RecordBatch, name: str) -> pa.Array:
    top = _top(name, batch.schema.names)
    column = batch.column(top)
    for key in ([] if top == name else name.split(".")[1:]):
        column = pc.struct_field(column, key)
    return column


def _read_table(path: str, index: int, fields: Fields, kind: str) -> Iterator[Record]:
    row = 0
    names = fields.names()
    for batch in _arrow_batches(path, names, kind):
        for values in zip(*(column.to_pylist() for column in batch)):
            row += 1
            yield fields.record(dict(zip(names, values)), index, row, f"{path}: row {row}")


def _unreadable_file(path: str, kind: str, error: Exception) -> PrepError:
    return PrepError(f"cannot read {path} as {kind}: {error}; check the file or pass --format")


def read_records(files: list[str], first_index: int, *, fmt: str | None, fields: Fields,
                 doc_boundary: str) -> Iterator[Record]:
    """All records of `files` in order; `first_index` is the global index of files[0]."""
    for offset, path in enumerate(files):
        index = first_index + offset
        kind = detect_format(path, fmt)
        if kind == "text" and (fields.pair or fields.label):
            raise PrepError(f"{path}: plain text has no fields; labelled data (--pair-field, --label-field) must be "
                            "JSONL, Parquet or Arrow")
        try:
            if kind == "text":
                yield from _read_text(path, index, doc_boundary)
            elif kind == "jsonl":
                yield from _read_jsonl(path, index, fields)
            else:
                yield from _read_table(path, index, fields, kind)
        except (OSError, EOFError, pa.ArrowException) as e:
            raise _unreadable_file(path, kind, e) from None


@dataclass
class Chunk:
    """Consecutive records on their way to a worker process: raw JSONL lines of one file (`path` set; parsed
    in the worker) or (text, error, label, pair_at) tuples, with each record's file index, line and size in bytes.
    A JSONL chunk may travel as one block of whole lines (`data`, its first line numbered `first_line`), split by
    `lines()` in the worker: one bytes object to pickle instead of a list of lines."""

    records: list | None
    path: str | None
    file_index: np.ndarray | int
    line: np.ndarray | None = None
    nbytes: np.ndarray | None = None
    data: bytes = b""
    first_line: int = 1

    def lines(self) -> "Chunk":
        """Split a block into its records (the lines that are not blank), numbered and sized as read; in place."""
        if self.records is None:
            parts = self.data.split(b"\n")
            ends = self.data.endswith(b"\n")
            if ends:
                parts.pop()
            lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
            nbytes = lengths + 1
            if not ends:  # the file's last line, without a newline
                nbytes[-1] -= 1
            line = np.arange(self.first_line, self.first_line + len(parts), dtype=np.int64)
            blank = (lengths == 0) | np.fromiter(map(bytes.isspace, parts), dtype=bool, count=len(parts))
            if blank.any():  # blank lines are no records
                keep = np.flatnonzero(~blank)
                parts, nbytes, line = [parts[i] for i in keep.tolist()], nbytes[keep], line[keep]
            self.records, self.line, self.nbytes, self.data = parts, line, nbytes, b""
            self.file_index = np.full(len(parts), self.file_index, dtype=np.int32)
        return self

    def __len__(self) -> int:
        return len(self.lines().records)


def _chunk(records: list, path: str | None, meta: list) -> Chunk:
    index, line, nbytes = zip(*meta) if meta else ((), (), ())
    return Chunk(records, path, np.array(index, dtype=np.int32), np.array(line, dtype=np.int64),
                 np.array(nbytes, dtype=np.int64))


def read_chunks(files: list[str], first_index: int, *, fmt: str | None, fields: Fields, doc_boundary: str,
                skip: int = 0, size_bytes: int = 1 << 20, max_records: int = 4096) -> Iterator[Chunk]:
    """The records of `read_records` after the first `skip`, in chunks of about `size_bytes` or `max_records`;
    JSONL comes as blocks of about `size_bytes` of whole lines of one file (however many records), split and parsed
    (`parse_jsonl`) in the worker."""
    records, meta, size = [], [], 0
    for offset, f in enumerate(files):
        if detect_format(f, fmt) == "jsonl":
            if records:
                yield _chunk(records, None, meta)
                records, meta, size = [], [], 0
            try:
                with _open_binary(f) as stream:
                    lineno = 0
                    while block := stream.read(size_bytes):
                        if not block.endswith(b"\n"):
                            block += stream.readline()  # whole lines only
                        chunk = Chunk(None, f, first_index + offset, data=block, first_line=lineno + 1)
                        lineno += block.count(b"\n")
                        if skip:  # resuming: drop the records already written
                            chunk.lines()
                            n = len(chunk.records)
                            chunk.records, chunk.file_index, chunk.line, chunk.nbytes = (
                                x[skip:] for x in (chunk.records, chunk.file_index, chunk.line, chunk.nbytes))
                            skip = max(0, skip - n)
                            if not chunk.records:
                                continue
                        yield chunk
            except (OSError, EOFError) as e:
                raise _unreadable_file(f, "jsonl", e) from None
            continue
        for r in read_records([f], first_index + offset, fmt=fmt, fields=fields, doc_boundary=doc_boundary):
            if skip:
                skip -= 1
                continue
            records.append((r.text, r.error, r.label, r.pair_at))
            meta.append((r.file_index, r.line, len(r.text or "")))
            size += meta[-1][2]
            if size >= size_bytes or len(records) >= max_records:
                yield _chunk(records, None, meta)
                records, meta, size = [], [], 0
    if records:
        yield _chunk(records, None, meta)
