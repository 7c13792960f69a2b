"""Atomic writes of small files: a temporary name in the same directory, fsync, then rename, so a reader
(or a re-run after a crash) sees the old file or the whole new one, never part of it; directory flushes and
file hashes."""
from __future__ import annotations

import hashlib
import json
import os


def write_bytes(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, ensure_ascii=False))


def fsync_dir(path: str) -> None:
    """Flush a directory's entries (new names, renames) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()
