"""Atomic writes of small files: a temporary name in the same directory, fsync, then rename, so a reader
(or a re-run after a crash) sees the old file or the whole new one, never part of it; directory flushes, file
hashes, and safetensors files as readable as any other file written here."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil

FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full disk, a quota, a file size limit
REFUSED = (*FULL, errno.EROFS)  # a write the system refused: those, and a read-only file system


def refused_write(e: BaseException, where: str, then: str | None = None) -> str | None:
    """`cannot write FILE: ERROR` for a write the system refused (`REFUSED`; FILE: the error's, else `where`), with
    `; free space there (or raise the quota) and THEN` (or `make it writable (or write elsewhere) and THEN`); None for
    any other failure."""
    if not isinstance(e, OSError) or e.errno not in REFUSED:
        return None
    line = f"cannot write {e.filename or where}: {os.strerror(e.errno)}"
    return f"{line}; {fix(e.errno)} and {then}" if then else line


def fix(code: int | None) -> str:
    """What frees a write the system refused with error number `code`."""
    if code in FULL:
        return "free space there (or raise the quota)"
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "make it writable (or write elsewhere)"
    return "check that file system"


def write_bytes(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:  # (e.g. `path` is a directory, a full disk: nothing is left beside it)
        if os.path.lexists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError) and e.filename in (None, tmp):  # (the file it was writing, by the name it has)
            raise type(e)(e.errno, e.strerror, path) from e
        raise


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, ensure_ascii=False))


def copy_file(src: str, dst: str) -> None:
    """shutil.copyfile (`dst` gets the mode a new file gets), where a write the system refused names `dst` (Linux's
    fast copy names the source)."""
    try:
        shutil.copyfile(src, dst)
    except OSError as e:
        if e.errno in REFUSED and e.filename != dst:
            raise OSError(e.errno, os.strerror(e.errno), dst) from e
        raise


def copy_tree(src: str, dst: str) -> None:
    """The files under `src` copied into `dst` (made, or added to; directories as made here, files by `copy_file`);
    the first that fails stops it with its OSError (shutil.copytree would go on, then raise every error as one list
    without an error number)."""
    for root, _, files in os.walk(src, followlinks=True):
        into = os.path.normpath(os.path.join(dst, os.path.relpath(root, src)))
        os.makedirs(into, exist_ok=True)
        for name in files:
            copy_file(os.path.join(root, name), os.path.join(into, name))


def install_dir(tmp: str, out: str) -> None:
    """Put the directory `tmp`, written whole, at `out`, replacing whatever directory was there (none of its files
    stay beside the new ones): the old one steps aside, the new one takes its name, then the old one goes. A reader
    sees the old directory or the whole new one (for a moment, neither); a crash leaves one of them whole."""
    old = f"{out}.old"
    shutil.rmtree(old, ignore_errors=True)  # (what a crash between the renames left: `tmp` is whole meanwhile)
    if os.path.lexists(out):
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def whole_dir(out: str):
    """Where a directory to put at `out` is written: OUT.tmp, emptied of what a run cut short left there (not made);
    when the block ends it replaces `out` (`install_dir`); on an error (a refused write, Ctrl-C) it goes."""
    tmp = f"{out.rstrip('/') or out}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield tmp
        install_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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


def umask_mode(paths) -> None:
    """Give files the mode a new file gets under the process's umask (0644 under umask 022). safetensors 0.8 writes
    through a temporary file of mode 0600 (safetensors issue 782): its files, ptm's checkpoint shards and
    transformers' save_pretrained weights, would be unreadable to the other users of a cluster's shared disk."""
    try:  # read where Linux shows it: setting it to learn it would change it for every thread meanwhile
        with open("/proc/self/status") as f:
            mask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration):
        mask = os.umask(0)
        os.umask(mask)
    for path in paths:
        os.chmod(path, 0o666 & ~mask)


@contextlib.contextmanager
def safetensors_errors(path: str):
    """A write that the system refused (a full disk, a quota) in safetensors, which raises its own error naming the
    errno, raised as the OSError any other write would raise."""
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as e:
        found = re.search(r"os error (\d+)", str(e))
        if found is None:
            raise
        raise OSError(int(found[1]), os.strerror(int(found[1])), path) from e


def save_safetensors(tensors: dict, path: str) -> None:
    """safetensors.torch.save_file, with the file's mode as umask gives (`umask_mode`); a refused write is an
    OSError (`safetensors_errors`)."""
    from safetensors.torch import save_file

    with safetensors_errors(path):
        save_file(tensors, path)
    umask_mode([path])


def save_pretrained(model, out: str, **options) -> None:
    """transformers' `model.save_pretrained(out, **options)`, with its weights' mode as umask gives (`umask_mode`); a
    refused write is an OSError (`safetensors_errors`)."""
    with safetensors_errors(out):
        model.save_pretrained(out, **options)
    umask_mode([os.path.join(out, f) for f in os.listdir(out) if f.endswith(".safetensors")])
