"""Input discovery and streaming readers for text, JSONL (plain, .gz, .zst), Parquet and Arrow files.

Every reader yields `Record`s in file order. A record that cannot be read (invalid UTF-8, malformed
JSON, missing text field) is yielded with `error` set, so the caller decides to skip or fail and can
name the file and line.
"""
from __future__ import annotations

import glob
import gzip
import io
import json
import os
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from data_prep import PrepError

FORMATS = ("text", "jsonl", "parquet", "arrow")
_EXT = {
    ".txt": "text", ".text": "text", ".md": "text",
    ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl",
    ".parquet": "parquet", ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow",
}
_COMPRESSED = (".gz", ".zst")


@dataclass
class Record:
    text: str | None
    file_index: int
    line: int  # 1-based line (text, JSONL) or row (Parquet, Arrow) where the record starts
    error: str | None = None


def detect_format(path: str, forced: str | None) -> str | None:
    if forced:
        return forced
    stem = path[: -len(ext)] if (ext := os.path.splitext(path)[1]) in _COMPRESSED else path
    return _EXT.get(os.path.splitext(stem)[1].lower())


def expand_inputs(inputs: list[str], forced_format: str | None) -> list[str]:
    """Files named by paths, directories (recursively, known extensions only) and globs, in a stable order."""
    files: list[str] = []
    for item in inputs:
        if os.path.isdir(item):
            found = sorted(
                os.path.join(root, f) for root, _, names in os.walk(item) for f in names
                if detect_format(f, forced_format) is not None
            )
            if not found:
                raise PrepError(f"input directory {item} holds no .txt/.jsonl/.parquet/.arrow files; "
                                "point at the files or pass --format")
            files += found
        elif os.path.isfile(item):
            files.append(item)
        elif any(c in item for c in "*?["):
            found = sorted(p for p in glob.glob(item, recursive=True) if os.path.isfile(p))
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
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith(".zst"):
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return open(path, "rb")


def _decode(raw: bytes, where: str) -> tuple[str | None, str | None]:
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as e:
        return None, f"{where}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})"


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


def _field(obj, dotted: str):
    for key in dotted.split("."):
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def _read_jsonl(path: str, index: int, text_field: str) -> Iterator[Record]:
    with _open_binary(path) as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            line, err = _decode(raw, where)
            if err:
                yield Record(None, index, lineno, err)
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                yield Record(None, index, lineno, f"{where}: malformed JSON ({e.msg} at column {e.colno})")
                continue
            text = _field(obj, text_field)
            if not isinstance(text, str):
                what = "no field" if text is None else f"non-string field ({type(text).__name__})"
                yield Record(None, index, lineno, f"{where}: {what} {text_field!r}; set --text-field")
                continue
            yield Record(text, index, lineno)


def _arrow_batches(path: str, text_field: str):
    if path.endswith(".parquet") or detect_format(path, None) == "parquet":
        pf = pq.ParquetFile(path)
        if text_field not in pf.schema_arrow.names:
            raise PrepError(f"{path}: no column {text_field!r} (columns: {', '.join(pf.schema_arrow.names)}); "
                            "set --text-field")
        yield from pf.iter_batches(columns=[text_field], batch_size=1024)
        return
    source = pa.memory_map(path)
    try:
        reader = pa.ipc.open_file(source)
        batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        schema = reader.schema
    except pa.ArrowInvalid:  # Hugging Face `datasets` writes the IPC stream format
        source.seek(0)
        reader = pa.ipc.open_stream(source)
        batches, schema = reader, reader.schema
    if text_field not in schema.names:
        raise PrepError(f"{path}: no column {text_field!r} (columns: {', '.join(schema.names)}); set --text-field")
    for batch in batches:
        yield batch.select([text_field])


def _read_table(path: str, index: int, text_field: str) -> Iterator[Record]:
    row = 0
    for batch in _arrow_batches(path, text_field):
        for value in batch.column(0).to_pylist():
            row += 1
            if isinstance(value, str):
                yield Record(value, index, row)
            else:
                yield Record(None, index, row, f"{path}: row {row}: {text_field!r} is {type(value).__name__}, not text")


def read_records(files: list[str], first_index: int, *, fmt: str | None, text_field: str,
                 doc_boundary: str) -> Iterator[Record]:
    """All records of `files` in order; `first_index` is the global index of files[0]."""
    for offset, path in enumerate(files):
        index = first_index + offset
        kind = detect_format(path, fmt)
        try:
            if kind == "text":
                yield from _read_text(path, index, doc_boundary)
            elif kind == "jsonl":
                yield from _read_jsonl(path, index, text_field)
            else:
                yield from _read_table(path, index, text_field)
        except (OSError, EOFError, pa.ArrowException) as e:
            raise PrepError(f"cannot read {path} as {kind}: {e}; check the file or pass --format") from None
