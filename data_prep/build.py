"""The build pipeline: read -> normalise -> filter -> de-duplicate -> tokenize -> Arrow shards -> manifest.

Order and determinism: input files are split into contiguous partitions by size; inside a partition,
records are processed in file order (worker processes return results in order), so the same inputs
and options give the same documents in the same order whatever `--workers` and `--num-partitions` are.

Crash safety: shards are written to a temporary name and renamed; after each shard the partition's
journal (`.partial/partNNNNN.json`) records the shard's sha256 and how many input records it covers.
A re-run checks the journalled shards by hash, keeps the good prefix and continues from there.
`manifest.json` is written last (atomically) by `finalize`; without it `verify` rejects the directory.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import glob
import hashlib
import io
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from data_prep import PrepError
from data_prep import text as T
from data_prep.encode import DocEncoder, EncodedChunk
from data_prep.shards import SHARD_SUFFIX, ShardWriter, shard_entry, to_numpy, write_table_atomic
from data_prep.sources import (Chunk, Fields, Problem, detect_format, expand_inputs, parse_jsonl, read_chunks,
                               read_records)
from data_prep.tokenizer import Tokenizer, load_tokenizer, train_byte_bpe, train_sentencepiece
from ptm.files import sha256_file, write_json, write_text

FORMAT_VERSION = 1
PARTIAL = ".partial"
MANIFEST = "manifest.json"
UNK_CHECK_DOCS = 1000
MAX_REJECTS_PER_SHARD = 10_000


@dataclass
class BuildOptions:
    inputs: list[str]
    out: str
    format: str | None = None
    text_field: str = "text"
    pair_field: str | None = None
    label_field: str | None = None
    doc_boundary: str = "blank-line"  # text files: file | blank-line | line
    text: T.TextOptions = field(default_factory=T.TextOptions)
    dedup: bool = True
    on_error: str = "fail"  # fail | skip
    tokenizer: str | None = None
    vocab_size: int = 32000
    model_type: str = "unigram"  # sentencepiece unigram | bpe, or byte_bpe (byte-level BPE, RoBERTa's specials)
    num_unused: int = 100
    sentinels: int = 0  # T5's <extra_id_k> after the vocabulary (span corruption)
    tokenizer_sample: int = 1_000_000
    entities: str | None = None
    shard_size: int = 256 << 20
    workers: int = 1
    num_partitions: int = 1
    partition: int | None = None
    max_unk_rate: float = 0.05
    seed: int = 1234
    overwrite: bool = False
    progress: bool = True

    @property
    def fields(self) -> Fields:
        return Fields(self.text_field, self.pair_field, self.label_field)

    def content_options(self) -> dict:
        """The options that decide the dataset's content (not how fast or where it is built)."""
        d = dataclasses.asdict(self)
        for k in ("out", "workers", "partition", "overwrite", "progress", "num_partitions"):
            d.pop(k)
        return d


def _log(msg: str) -> None:
    print(f"data_prep: {msg}", file=sys.stderr, flush=True)


def _fingerprint(opts: BuildOptions, files: list[str], tokenizer_sha: str) -> str:
    h = hashlib.sha256(json.dumps(opts.content_options(), sort_keys=True, default=str).encode())
    for f in files:
        h.update(f"{os.path.abspath(f)}\0{os.path.getsize(f)}\0".encode())
    h.update(f"{tokenizer_sha}\0{opts.num_partitions}".encode())  # journals are per partition layout
    h.update(b"specials in text are text\0")  # (a build journalled before that rule restarts, not mixes the two)
    return h.hexdigest()


def partition_files(files: list[str], k: int) -> list[tuple[int, list[str]]]:
    """Contiguous runs of files of about equal bytes: [(index of first file, files)] per partition. A file goes to
    the partition its middle byte falls in, and no partition is left without a file while there are enough."""
    sizes = np.array([max(os.path.getsize(f), 1) for f in files], dtype=np.float64)
    middles = (np.cumsum(sizes) - sizes / 2) / max(sizes.sum(), 1)
    starts = np.searchsorted(middles, np.arange(k) / k)  # the first file of each partition
    n = len(files)
    for p in range(1, k):  # at least one file each, as far as they go
        starts[p] = min(max(starts[p], starts[p - 1] + 1), max(n - (k - p), starts[p - 1]))
    ends = np.append(starts[1:], n)
    return [(int(a), files[a:b]) for a, b in zip(starts.tolist(), ends.tolist())]


def _entities(path: str | None, opts: T.TextOptions) -> list[str]:
    if not path:
        return []
    if not os.path.isfile(path):
        raise PrepError(f"entity dictionary not found: {path}; pass a UTF-8 file with one entity per line")
    try:
        with open(path, encoding="utf-8") as f:
            return [e for line in f if (e := T.normalize(line, opts))]
    except UnicodeDecodeError as e:
        raise PrepError(f"entity dictionary {path} is not UTF-8 ({e.reason} at byte {e.start}); convert it to UTF-8 "
                        "(e.g. iconv -t utf-8)") from None


# ---- records -> outcomes, in worker processes -------------------------------------------------------

_ENCODER: DocEncoder | None = None
_FIELDS: Fields | None = None


def keep_freed_memory() -> bool:
    """Let glibc's malloc keep the blocks a chunk frees for the next one. By default it hands blocks of 128 KB to
    32 MB back to the system (mmap, or a trim of the heap) and takes them again page by page, a page fault each:
    about 10% of a build, whose chunks allocate and free the same arrays over and over. No mmap under 32 MB, no trim
    under 1 GB; the process's memory stays at its peak, which a build reaches in its first chunks. False where the
    C library has no mallopt (nothing to do)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20)) & bool(mallopt(M_TRIM_THRESHOLD, 1 << 30))


def _init_worker(tok_dir: str, threads: int, text_opts: T.TextOptions, entities: list[str], fields: Fields,
                 ending=None) -> None:
    global _ENCODER, _FIELDS
    keep_freed_memory()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if mp.parent_process() is not None:  # a pool worker: nothing it makes holds a cycle (see build_partition)
        gc.disable()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the main process stops the pool and says so once
        # scancel's SIGTERM alike, until the main process ends the pool (`ending`) with it: a worker that died of it
        # waiting for a chunk would hold the pool's queue lock, and Pool.terminate() wait for it forever
        signal.signal(signal.SIGTERM, lambda *_: os._exit(128 + signal.SIGTERM) if ending.is_set() else None)
    _ENCODER, _FIELDS = DocEncoder(load_tokenizer(tok_dir, threads), text_opts, entities), fields


# What became of each record: a document, filtered by length, unreadable, or (decided in the main process) a
# duplicate of an earlier document
SHORT, LONG, ERROR, DOC, DUPLICATE = range(5)


@dataclass
class Processed:
    """A chunk's outcome: per record its kind, its row in `encoded` (DOC) and label; error messages by record."""

    kinds: np.ndarray
    rows: np.ndarray
    labels: np.ndarray
    errors: dict[int, Problem]
    encoded: EncodedChunk | None
    file_index: np.ndarray
    line: np.ndarray
    nbytes: np.ndarray


def _texts(chunk: Chunk, fields: Fields) -> tuple[list[str | None], np.ndarray, dict[int, Problem], np.ndarray]:
    """The chunk's texts (None for a record that failed), labels, error messages by record and, per record, where
    a labelled pair's blank line joins its fields (-1: no pair)."""
    n = len(chunk)
    labels, errors, pairs = np.full(n, -1, dtype=np.int64), {}, np.full(n, -1, dtype=np.int64)
    if chunk.path is None:  # (text, error, label, pair_at) records
        for i, (_, error, labels[i], pairs[i]) in enumerate(chunk.records):
            if error:
                errors[i] = error
        return [r[0] for r in chunk.records], labels, errors, pairs
    if fields.plain:
        try:  # the common case, a comprehension: JSON objects with a string text field, in valid UTF-8
            texts = [json.loads(line.decode("utf-8"))[fields.text] for line in chunk.records]
            if all(type(t) is str for t in texts):
                return texts, labels, errors, pairs
        except (ValueError, KeyError, TypeError):  # UnicodeDecodeError, JSONDecodeError, no text, not an object
            pass
    texts = []
    for i, line in enumerate(chunk.records):
        r = parse_jsonl(line, chunk.path, int(chunk.file_index[i]), int(chunk.line[i]), fields)
        texts.append(r.text)
        labels[i], pairs[i] = r.label, r.pair_at
        if r.error:
            errors[i] = r.error
    return texts, labels, errors, pairs


def _normalized(texts: list[str | None], pairs: np.ndarray, opts: T.TextOptions) -> tuple[list[str], np.ndarray]:
    """The texts normalised ("" for None), and where each pair's second field starts in its normalised text (-1:
    none): a pair's fields are normalised apart and joined by one blank line, so paragraphs inside the first
    field do not move the second's start."""
    out = [T.normalize(t, opts) if t is not None else "" for t in texts]
    second = np.full(len(texts), -1, dtype=np.int64)
    for i in np.flatnonzero(pairs >= 0).tolist():
        if texts[i] is not None:
            a, b = T.normalize(texts[i][:pairs[i]], opts), T.normalize(texts[i][pairs[i] + 2:], opts)
            out[i] = f"{a}\n\n{b}" if a and b else a or b
            second[i] = len(a) + 2 if a and b else -1
    return out, second


def _process(chunk: Chunk) -> Processed:
    """Parse (raw JSONL), normalise, filter and encode a chunk's records."""
    opts = _ENCODER.opts
    texts, labels, errors, pairs = _texts(chunk.lines(), _FIELDS)
    kinds = np.full(len(chunk), DOC, dtype=np.int8)
    kinds[list(errors)] = ERROR
    texts, second = _normalized(texts, pairs, opts)
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    kinds[(kinds == DOC) & (lengths < max(opts.min_chars, 1))] = SHORT
    if opts.max_chars:
        kinds[(kinds == DOC) & (lengths > opts.max_chars)] = LONG
    docs = np.flatnonzero(kinds == DOC)
    rows = np.full(len(chunk), -1, dtype=np.int32)
    rows[docs] = np.arange(len(docs))
    encoded = _ENCODER.encode([texts[i] for i in docs.tolist()], second[docs]) if len(docs) else None
    if encoded is not None:  # a document of no tokens is too short
        kinds[docs[np.diff(encoded.tok_off) == 0]] = SHORT
    return Processed(kinds, rows, labels, errors, encoded, chunk.file_index, chunk.line, chunk.nbytes)


def _unreadable(error: str) -> PrepError:
    """The --on-error fail stop at an unreadable record; `error` names its file and line."""
    fix = ", or" if "; " in error else "; fix the input or"  # (the error may name its own fix)
    return PrepError(f"{error}{fix} pass --on-error skip to skip such records")


# ---- tokenizer ----------------------------------------------------------------------------------------

def sample_sentences(files: list[str], opts: BuildOptions) -> list[str]:
    """A uniform, seeded reservoir sample of at most `tokenizer_sample` sentences from all inputs.
    Unreadable records stop it with --on-error fail, before any training, and are left out with skip."""
    rng = random.Random(opts.seed)
    sample: list[str] = []
    seen = 0
    for r in read_records(files, 0, fmt=opts.format, fields=opts.fields, doc_boundary=opts.doc_boundary):
        if r.error:
            if opts.on_error == "fail":
                raise _unreadable(r.error)
            continue
        for s in T.split_sentences(T.normalize(r.text, opts.text)):
            s = s.strip()
            if not s:
                continue
            seen += 1
            if len(sample) < opts.tokenizer_sample:
                sample.append(s)
            elif (j := rng.randrange(seen)) < opts.tokenizer_sample:
                sample[j] = s
    return sample


def train_tokenizer(files: list[str], opts: BuildOptions, directory: str) -> Tokenizer:
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise PrepError(f"{directory} is a file, not a directory for the tokenizer; choose another --out")
    t0 = time.time()
    sentences = sample_sentences(files, opts)
    kind = "byte-level BPE" if opts.model_type == "byte_bpe" else f"{opts.model_type} sentencepiece"
    _log(f"training a {opts.vocab_size}-piece {kind} model on {len(sentences):,} sentences")
    if opts.model_type == "byte_bpe":
        tok = train_byte_bpe(sentences, directory, vocab_size=opts.vocab_size, threads=os.cpu_count() or 1)
    else:
        tok = train_sentencepiece(sentences, directory, vocab_size=opts.vocab_size, model_type=opts.model_type,
                                  num_unused=opts.num_unused, threads=os.cpu_count() or 1)
    if opts.sentinels:
        tok = tok.with_sentinels(opts.sentinels).save(directory)
    _log(f"tokenizer trained in {time.time() - t0:.1f}s -> {directory}")
    return tok


def _tokenizer_recipe(opts: BuildOptions) -> str:
    if opts.tokenizer:
        return f"given:{load_tokenizer(opts.tokenizer).sha256()}:sentinels={opts.sentinels}"
    keys = ("vocab_size", "model_type", "num_unused", "sentinels", "tokenizer_sample", "seed", "text", "format",
            "text_field", "pair_field", "doc_boundary", "inputs")
    return "trained:" + json.dumps({k: getattr(opts, k) for k in keys}, sort_keys=True, default=str)


def _install_tokenizer(src: Tokenizer, directory: str) -> Tokenizer:
    """Copy `src` to `directory` atomically; partitions started at once (Slurm array tasks) may race here."""
    if os.path.isdir(directory):
        try:
            if load_tokenizer(directory).sha256() == src.sha256():
                return load_tokenizer(directory)
        except (PrepError, OSError, RuntimeError):
            pass
        shutil.rmtree(directory, ignore_errors=True)
    tmp = f"{directory}.tmp{os.getpid()}"
    src.save(tmp)
    try:
        os.rename(tmp, directory)
    except OSError:  # another partition installed it first
        shutil.rmtree(tmp, ignore_errors=True)
    return load_tokenizer(directory)


def prepare_tokenizer(files: list[str], opts: BuildOptions) -> Tokenizer:
    """The dataset's tokenizer in OUT/tokenizer: copied from --tokenizer, reused from an interrupted
    build with the same recipe, or trained on the corpus."""
    directory = os.path.join(opts.out, "tokenizer")
    marker = os.path.join(opts.out, PARTIAL, "tokenizer.json")
    recipe = _tokenizer_recipe(opts)
    if os.path.isfile(marker):
        with open(marker) as f:
            if json.load(f).get("recipe") == recipe:
                return load_tokenizer(directory)
    if opts.tokenizer:
        given = load_tokenizer(opts.tokenizer)
        tok = _install_tokenizer(given.with_sentinels(opts.sentinels) if opts.sentinels else given, directory)
    else:
        if opts.num_partitions > 1:
            raise PrepError("a partitioned build needs one shared tokenizer: run `python -m data_prep "
                            "train-tokenizer INPUT... --out TOKDIR` first and pass --tokenizer TOKDIR")
        tok = train_tokenizer(files, opts, directory)
    write_json(marker, {"recipe": recipe, "sha256": tok.sha256()})
    return tok


# ---- one partition ------------------------------------------------------------------------------------

def _journal_path(out: str, p: int) -> str:
    return os.path.join(out, PARTIAL, f"part{p:05d}.json")


def _resume(out: str, p: int, fingerprint: str, files: list[str]) -> dict:
    """The journal of partition p (of `files`) with its longest prefix of intact shards; other files of p removed."""
    journal = {"fingerprint": fingerprint, "files": files, "shards": [], "done": False}
    path = _journal_path(out, p)
    if os.path.isfile(path):
        with open(path) as f:
            old = json.load(f)
        if (old.get("fingerprint"), old.get("files")) == (fingerprint, files):
            for entry in old["shards"]:
                shard = os.path.join(out, entry["file"] or "")
                if entry["file"] and (not os.path.isfile(shard) or sha256_file(shard) != entry["sha256"]):
                    _log(f"shard {entry['file']} is missing or damaged; rebuilding partition {p} from there")
                    break
                journal["shards"].append(entry)
            journal["done"] = old["done"] and len(journal["shards"]) == len(old["shards"])
    keep = {e["file"] for e in journal["shards"]}
    for name in os.listdir(out):
        if name.startswith(f"part{p:05d}-") and name not in keep:
            os.remove(os.path.join(out, name))
    return journal


def _new_stats() -> dict:
    return {"records": 0, "documents": 0, "tokens": 0, "chars": 0, "skipped": {}, "filtered_short": 0,
            "filtered_long": 0, "duplicates": 0}


def build_partition(files: list[str], first_index: int, p: int, tok: Tokenizer, fingerprint: str,
                    opts: BuildOptions, entities: list[str]) -> dict:
    out = opts.out
    journal = _resume(out, p, fingerprint, files)
    if journal["done"]:
        _log(f"partition {p}: already complete ({sum(1 for e in journal['shards'] if e['file'])} shards)")
        return journal
    done = journal["shards"]
    cursor = done[-1]["cursor"] if done else 0
    stats = dict(done[-1]["stats"]) if done else _new_stats()
    seen: set[int] = set()
    if opts.dedup:
        for e in done:
            if not e["file"]:
                continue
            with pa.memory_map(os.path.join(out, e["file"])) as src:
                seen.update(to_numpy(pa.ipc.open_file(src).get_batch(0).column("doc_hash")).tolist())
    if done:
        _log(f"partition {p}: resuming after {len(done)} intact shards ({cursor:,} records)")

    keep_freed_memory()  # the main process's shards too; forked workers inherit it
    writer = ShardWriter(out, f"part{p:05d}", tok.vocab_size, opts.shard_size, first_index=sum(1 for e in done if e["file"]))
    threads = max(1, (os.cpu_count() or 1) // max(opts.workers, 1))
    chunks = read_chunks(files, first_index, fmt=opts.format, fields=opts.fields, doc_boundary=opts.doc_boundary,
                         skip=cursor)
    init = (os.path.join(out, "tokenizer"), threads, opts.text, entities, opts.fields)
    pool = None
    if opts.workers > 1:
        ctx = mp.get_context("spawn" if "mpi4py" in sys.modules else "fork")
        ending = ctx.Event()
        pool = ctx.Pool(opts.workers, initializer=_init_worker, initargs=(*init, ending))
        # Pool.imap reads its input as fast as it can; the semaphore keeps at most 4 chunks per worker in
        # flight, so memory stays bounded when reading outpaces tokenizing.
        in_flight, stop = threading.Semaphore(4 * opts.workers), threading.Event()
        results = _released(pool.imap(_process, _acquired(chunks, in_flight, stop), chunksize=1), in_flight,
                            mp.active_children())
    else:
        _init_worker(*init)
        results = map(_process, chunks)

    bar = _Progress(files, first_index, p) if opts.progress and files else None
    rejects: list[str] = []
    unk = [0, 0]  # unk tokens, tokens over the first UNK_CHECK_DOCS documents
    # No cyclic garbage collection while the chunks stream: what the loop makes (strings, arrays, lists of them)
    # is freed by reference counts, and the collector's passes, set off by the allocations, cost 6% of a build.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for r in results:
            rejects = _write_chunk(r, writer, seen, stats, rejects, unk, tok, opts,
                                   lambda entry, at, st, rj: _journal_shard(out, p, journal, entry, cursor + at, st, rj))
            cursor += len(r.kinds)
            if bar is not None:
                bar.advance(r.file_index, r.nbytes, stats)
        if stats["documents"] < UNK_CHECK_DOCS:
            _check_unk(tok, opts, *unk)
        journal["done"] = True
        _journal_shard(out, p, journal, writer.flush(), cursor, stats, rejects)
    finally:
        if collecting:
            gc.enable()
        if pool is not None:
            stop.set()
            ending.set()
            pool.terminate()
        if bar is not None:
            bar.close()
    return journal


def _write_chunk(r: Processed, writer: ShardWriter, seen: set[int], stats: dict, rejects: list[str], unk: list[int],
                 tok: Tokenizer, opts: BuildOptions, journal) -> list[str]:
    """Add a processed chunk's new documents to the shards, in order, with a few numpy calls: drop duplicates
    (of `seen` or of an earlier record of the chunk) and flush a shard where the next document does not fit,
    calling journal(entry, records of the chunk before that document, stats and rejects up to there); then
    `stats` counts the whole chunk. Returns the rejects not journalled yet."""
    if r.errors and opts.on_error == "fail":
        raise _unreadable(r.errors[min(r.errors)])
    doc, enc = np.flatnonzero(r.kinds == DOC), r.encoded
    if opts.dedup and len(doc):
        hashes = enc.hashes[r.rows[doc]]
        first = np.zeros(len(doc), dtype=bool)
        first[np.unique(hashes, return_index=True)[1]] = True
        new = first & ~np.fromiter(map(seen.__contains__, hashes.tolist()), dtype=bool, count=len(doc))
        r.kinds[doc[~new]] = DUPLICATE
        seen.update(hashes[new].tolist())
        doc = doc[new]
    rows = r.rows[doc]
    sizes, tokens, chars = (writer.sizes(enc)[rows], np.diff(enc.tok_off)[rows], enc.chars[rows]) if len(doc) else ((),) * 3
    if stats["documents"] < UNK_CHECK_DOCS and len(doc):
        k = UNK_CHECK_DOCS - stats["documents"]
        unk[0], unk[1] = unk[0] + int(enc.unk[rows[:k]].sum()), unk[1] + int(tokens[:k].sum())
        if len(doc) >= k:
            _check_unk(tok, opts, *unk)
    errors = sorted(r.errors.items())

    def counted(at: int) -> dict:
        """The stats with the chunk's records before `at` counted."""
        st = json.loads(json.dumps(stats))
        kinds, n = r.kinds[:at], int(np.searchsorted(doc, at))
        st["records"] += at
        for key, kind in (("filtered_short", SHORT), ("filtered_long", LONG), ("duplicates", DUPLICATE)):
            st[key] += int((kinds == kind).sum())
        st["documents"] += n
        st["tokens"] += int(np.sum(tokens[:n]))
        st["chars"] += int(np.sum(chars[:n]))
        for _, problem in errors[:np.searchsorted([i for i, _ in errors], at)]:
            st["skipped"][problem.kind] = st["skipped"].get(problem.kind, 0) + 1
        return st

    def rejected(lo: int, hi: int) -> list[str]:
        return [msg for i, msg in errors if lo <= i < hi][:max(0, MAX_REJECTS_PER_SHARD - len(rejects))]

    i, journalled = 0, 0  # documents added; records journalled
    while i < len(doc):
        at = int(doc[i])
        if writer.full_for(int(sizes[i])):  # the journal entry covers the records before this document
            journal(writer.flush(), at, counted(at), rejects + rejected(journalled, at))
            rejects, journalled = [], at
        k = writer.fitting(sizes[i:])
        records = doc[i:i + k]
        writer.add(enc, rows[i:i + k], int(sizes[i:i + k].sum()), r.file_index[records], r.line[records],
                   r.labels[records])
        i += k
    rejects = rejects + rejected(journalled, len(r.kinds))
    st = counted(len(r.kinds))
    stats.clear()
    stats.update(st)
    return rejects


def _acquired(items, sem, stop):
    for item in items:
        while not sem.acquire(timeout=0.1):
            if stop.is_set():  # the main loop failed: let Pool.terminate() join this feeder thread
                return
        yield item


def _released(results, sem, workers):
    """imap's results in order, each freeing a place in flight. A worker that dies (the out-of-memory killer) is an
    error, not a wait forever: Pool starts another, but the chunk the dead one held never comes back."""
    while True:
        try:
            r = results.next(timeout=1)
        except StopIteration:
            return
        except mp.TimeoutError:
            dead = next((w for w in workers if w.exitcode is not None), None)
            if dead is None:
                continue
            how = (f"was killed by {signal.Signals(-dead.exitcode).name}" if dead.exitcode < 0 else
                   f"exited with status {dead.exitcode}")
            raise PrepError(f"build worker (pid {dead.pid}) {how}, most often by the system's out-of-memory killer "
                            "(`dmesg` says so); give the build more memory or fewer --workers, then re-run the same "
                            "command to resume after its last finished shard") from None
        sem.release()
        yield r


def _check_unk(tok: Tokenizer, opts: BuildOptions, unk: int, total: int) -> None:
    if total and unk / total > opts.max_unk_rate:
        raise PrepError(
            f"tokenizer {opts.tokenizer or 'trained'} ({tok.kind}) maps {100 * unk / total:.1f}% of tokens to [UNK] "
            f"in the first documents (limit {100 * opts.max_unk_rate:.1f}%): it does not fit this text; use a "
            "tokenizer for this language, train one (omit --tokenizer), or raise --max-unk-rate")


def _journal_shard(out, p, journal, entry, cursor, stats, rejects) -> None:
    """Record a finished shard (or, with entry None, records that produced no documents)."""
    entry = dict(entry or {"file": None})
    entry.update(cursor=cursor, stats=json.loads(json.dumps(stats)), rejects=rejects)
    journal["shards"].append(entry)
    write_json(_journal_path(out, p), journal)


class _Progress:
    """tqdm bar over input bytes, with documents/s and tokens/s. Without a terminal (a Slurm log, say)
    the same line is logged every LOG_EVERY seconds instead."""

    LOG_EVERY = 30.0

    def __init__(self, files: list[str], first_index: int, p: int):
        from tqdm import tqdm

        self.sizes = [os.path.getsize(f) for f in files]
        self.first = first_index
        self.tty = sys.stderr.isatty()
        self.bar = tqdm(total=sum(self.sizes), unit="B", unit_scale=True, desc=f"part {p}", dynamic_ncols=True,
                        file=sys.stderr if self.tty else io.StringIO(), mininterval=0.5 if self.tty else 1e9)
        self.t0 = self.logged = time.time()
        self.file, self.in_file, self.done_bytes = 0, 0, 0

    def advance(self, file_index: np.ndarray, nbytes: np.ndarray, stats: dict) -> None:
        """Records of (global) `file_index` and `nbytes` each are done."""
        for i in np.flatnonzero(np.diff(file_index, append=-1)):  # the last record of each file among them
            local = int(file_index[i]) - self.first
            while self.file < local:
                self.done_bytes += self.sizes[self.file]
                self.file, self.in_file = self.file + 1, 0
            self.in_file += int(nbytes[file_index == file_index[i]].sum())
        pos = self.done_bytes + min(self.in_file, self.sizes[self.file]) if len(file_index) else self.bar.n
        if pos > self.bar.n:
            self.bar.update(pos - self.bar.n)
            dt = max(time.time() - self.t0, 1e-9)
            self.bar.set_postfix_str(f"{stats['documents'] / dt:,.0f} docs/s {stats['tokens'] / dt:,.0f} tok/s",
                                     refresh=False)
            if not self.tty and time.time() - self.logged > self.LOG_EVERY:
                self.logged = time.time()
                _log(str(self.bar))

    def close(self) -> None:
        self.bar.update(self.bar.total - self.bar.n)
        self.bar.close()


# ---- whole builds ----------------------------------------------------------------------------------

def _check_output(opts: BuildOptions) -> None:
    try:
        os.makedirs(os.path.join(opts.out, PARTIAL), exist_ok=True)
        probe = os.path.join(opts.out, PARTIAL, f".probe{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise PrepError(f"cannot write to output directory {opts.out}: {e.strerror}; choose another --out") from None


def _mpi_comm():
    """The MPI world communicator when started by mpirun/srun with several ranks, else None."""
    if not any(int(os.environ.get(v, "1")) > 1 for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")):
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        raise PrepError("started under MPI but mpi4py is missing; pip install 'ptm[mpi]'") from None
    return MPI.COMM_WORLD


def _message(error: BaseException | None) -> str | None:
    return None if error is None else str(error) if isinstance(error, PrepError) else f"{type(error).__name__}: {error}"


def _together(comm, fn, everywhere: bool = True):
    """fn() on every rank (or, `everywhere` False, on rank 0 only, whose result every rank gets). Without MPI just
    fn(). Under MPI the ranks then learn together whether any of them failed, and all stop: the failed rank with its
    error, the others with one line naming it, so that no rank is left waiting at a collective for one that
    stopped."""
    if comm is None:
        return fn()
    result = error = None
    if everywhere or comm.rank == 0:
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - every rank must hear of it; re-raised below
            error = e
    if everywhere:
        messages = comm.allgather(_message(error))
    else:
        result, message = comm.bcast((result, _message(error)), root=0)
        messages = [message]
    if error is not None:
        raise error
    for rank, message in enumerate(messages):
        if message:
            raise PrepError(f"rank {rank} stopped: {message}")
    return result


def build(opts: BuildOptions) -> dict | None:
    """Build OUT from INPUTS. Returns the manifest, or None when only one partition of several was built."""
    comm = _mpi_comm()
    if comm is not None:
        opts = dataclasses.replace(opts, num_partitions=comm.size, partition=comm.rank,
                                   progress=opts.progress and comm.rank == 0)
    if opts.partition is not None and not 0 <= opts.partition < opts.num_partitions:
        raise PrepError(f"--partition {opts.partition} is outside 0..{opts.num_partitions - 1} (--num-partitions "
                        f"{opts.num_partitions})")
    if not 1 << 12 <= opts.shard_size <= 1 << 30:
        raise PrepError(f"--shard-size {opts.shard_size} must be between 4 KiB and 1 GiB")
    structure = opts.text.structure
    if opts.pair_field and not T.has(structure, "sentences"):
        raise PrepError(f"--pair-field needs sentences (the pair's second text starts one); --structure {structure} "
                        "keeps none: pass --structure sentences or more")
    if opts.entities and not T.has(structure, "full"):
        raise PrepError(f"--entities records entity spans, which only --structure full keeps (not {structure})")
    entities = _entities(opts.entities, opts.text)  # (a file missing or not UTF-8: said before the tokenizer trains)
    files = expand_inputs(opts.inputs, opts.format, opts.out)

    def start() -> dict | None:
        """Rank 0's part before the partitions: the finished manifest when there is nothing to do; else None,
        with the tokenizer in place and the build recorded."""
        manifest_path = os.path.join(opts.out, MANIFEST)
        if os.path.isfile(manifest_path):
            if not opts.overwrite:
                with open(manifest_path) as f:
                    old = json.load(f)
                changed = _built_otherwise(old, opts, files)
                if not changed:
                    _log(f"{opts.out} is already built with these options; nothing to do")
                    _finished(opts.out)
                    return old
                raise PrepError(f"{opts.out} already holds a finished dataset built from other options or inputs "
                                f"({'; '.join(changed)}); pass --overwrite or choose another --out")
            _clear(opts.out)
        made = [d for d in (opts.out, os.path.join(opts.out, PARTIAL)) if not os.path.isdir(d)]
        try:
            _check_output(opts)
            tok = prepare_tokenizer(files, dataclasses.replace(opts, num_partitions=1) if comm else opts)
        except BaseException:  # no tokenizer, nothing built: the directories this start made go, if still empty
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            raise
        record_build(opts, files, _fingerprint(opts, files, tok.sha256()))
        return None

    done = _together(comm, start, everywhere=False)
    if done is not None:
        return done if comm is None or comm.rank == 0 else None
    if comm is not None:
        _together(comm, lambda: _check_output(opts))  # every node's view of OUT
    tok = load_tokenizer(os.path.join(opts.out, "tokenizer"))
    fingerprint = _fingerprint(opts, files, tok.sha256())
    parts = partition_files(files, opts.num_partitions)
    todo = range(opts.num_partitions) if opts.partition is None else [opts.partition]
    for p in todo:
        first, part_files = parts[p]
        _together(comm, lambda: build_partition(part_files, first, p, tok, fingerprint, opts, entities))
    if comm is not None:
        manifest = _together(comm, lambda: finalize(opts.out, opts=opts, files=files), everywhere=False)
        return manifest if comm.rank == 0 else None
    if opts.partition is not None and opts.num_partitions > 1:
        _log(f"partition {opts.partition} of {opts.num_partitions} done; run `python -m data_prep finalize "
             f"{opts.out}` after all partitions finish")
        return None
    return finalize(opts.out, opts=opts, files=files)


def _clear(out: str) -> None:
    for name in os.listdir(out):
        path = os.path.join(out, name)
        if name in (MANIFEST, "rejects.txt") or name.endswith(SHARD_SUFFIX):
            os.remove(path)
        elif name in (PARTIAL, "tokenizer", ".ptm_index"):  # .ptm_index: training's cached index maps
            shutil.rmtree(path)


def _read_build_record(out: str) -> dict | None:
    """The unfinished build's record; None when OUT is a finished dataset with none (nothing to finalize)."""
    path = os.path.join(out, PARTIAL, "build.json")
    if not os.path.isfile(path):
        if os.path.isfile(os.path.join(out, MANIFEST)):
            return None
        raise PrepError(f"{out} has no unfinished build to finalize (missing {PARTIAL}/build.json); run "
                        "`python -m data_prep build ... --out` first")
    with open(path) as f:
        return json.load(f)


def _journalled_shards(out: str) -> int:
    """How many shards the partitions' journals in OUT list."""
    n = 0
    for path in glob.glob(os.path.join(out, PARTIAL, "part*.json")):
        with open(path) as f:
            n += sum(1 for e in json.load(f)["shards"] if e["file"])
    return n


def _built_otherwise(manifest: dict, opts: BuildOptions, files: list[str]) -> list[str]:
    """How a finished dataset (its manifest) differs from a build of `opts` from `files`: its options, then its input
    files by path and size, in order (the documents' order), however they were named."""
    options = json.loads(json.dumps(opts.content_options(), default=str))
    was = [(s["path"], s["bytes"]) for s in manifest.get("sources", [])]
    changed = _changes(manifest.get("options", {}), options, with_inputs=not was)
    if opts.tokenizer and manifest.get("options", {}).get("tokenizer") != opts.tokenizer:  # the same one elsewhere?
        given = load_tokenizer(opts.tokenizer)
        given = given.with_sentinels(opts.sentinels) if opts.sentinels else given
        if given.sha256() == manifest.get("tokenizer", {}).get("sha256"):
            changed = [c for c in changed if not c.startswith("tokenizer ")]
    now = [(os.path.abspath(f), os.path.getsize(f)) for f in files]
    if was and was != now:
        a, b = dict(was), dict(now)
        changed += [f"{f}: {a.get(f, 'not an input')} -> {b.get(f, 'not an input')} bytes"
                    for f in sorted(set(a) | set(b)) if a.get(f) != b.get(f)][:3] or ["the inputs' order"]
    return changed


def _changes(was: dict, options: dict, with_inputs: bool = False) -> list[str]:
    """`KEY OLD -> NEW` for each content option that differs (the text options lifted to the top)."""
    def flat(o: dict) -> dict:
        return {k: v for key, x in o.items() for k, v in (x.items() if isinstance(x, dict) else [(key, x)])}

    was, options = flat(was), flat(options)
    return [f"{k} {was.get(k)!r} -> {v!r}" for k, v in options.items()
            if was.get(k) != v and (with_inputs or k != "inputs")]


def record_build(opts: BuildOptions, files: list[str], fingerprint: str) -> None:
    """Remember the options in OUT so that `finalize` (maybe on another node) can write the manifest and check that
    every partition was built from them (`fingerprint`). Shards of an unfinished build of other options or inputs
    are said not to be reused (each partition's journal then starts over)."""
    path = os.path.join(opts.out, PARTIAL, "build.json")
    record = {"options": json.loads(json.dumps(opts.content_options(), default=str)),
              "num_partitions": opts.num_partitions, "files": files, "fingerprint": fingerprint}
    if os.path.isfile(path):
        with open(path) as f:
            old = json.load(f)
        shards = _journalled_shards(opts.out)
        if old.get("fingerprint") != fingerprint and shards:
            changed = _changes(old.get("options", {}), record["options"])
            if old.get("num_partitions") != opts.num_partitions:
                changed.append(f"num_partitions {old.get('num_partitions')} -> {opts.num_partitions}")
            if old.get("files") != files:
                changed.append("the input files")
            changed = changed or ["the inputs' sizes or the tokenizer"]
            _log(f"{opts.out}: the {shards} shards of an unfinished build of other options or inputs "
                 f"({'; '.join(changed)}) are not reused"
                 + ("; build every partition with these options" * (opts.num_partitions > 1)))
    write_json(path, record)


def _dedup_across_partitions(out: str, journals: list[dict]) -> int:
    """Drop documents already seen in an earlier partition (partitions de-duplicate only themselves);
    shards that lose rows are rewritten atomically. A shard with fewer rows than its journal entry lost them to a
    run cut short: its entry is brought up to date too. Returns the number of documents dropped."""
    seen: set[int] = set()
    dropped = 0
    for journal in journals:
        for entry in journal["shards"]:
            if not entry["file"]:
                continue
            path = os.path.join(out, entry["file"])
            with pa.memory_map(path) as src:
                batch = pa.ipc.open_file(src).get_batch(0)
                hashes = to_numpy(batch.column("doc_hash"))
                keep = np.ones(len(hashes), dtype=bool)
                for i, h in enumerate(hashes.tolist()):
                    keep[i] = h not in seen
                    seen.add(h)
                if not keep.all():
                    batch = batch.filter(pa.array(keep))
                    now = write_table_atomic(path, batch, batch.schema)
                elif batch.num_rows != entry["num_documents"]:  # rewritten by a run cut short
                    now = shard_entry(path, batch)
                else:
                    continue
            dropped += entry["num_documents"] - batch.num_rows
            entry.update(now)
    return dropped


def _finished(out: str) -> None:
    """What a finished build (its manifest written last) left of its work when it was cut short: removed."""
    shutil.rmtree(os.path.join(out, PARTIAL), ignore_errors=True)


def finalize(out: str, opts: BuildOptions | None = None, files: list[str] | None = None) -> dict:
    """Check every partition finished, de-duplicate across partitions, write manifest.json last; on a finished
    dataset with no unfinished build (a re-run chain), its manifest, untouched."""
    rec = _read_build_record(out)
    if rec is None:
        _log(f"{out} is already built and has no unfinished build; nothing to finalize")
        with open(os.path.join(out, MANIFEST)) as f:
            return json.load(f)
    if opts is None:
        num_partitions, files, content = rec["num_partitions"], rec["files"], rec["options"]
    else:
        num_partitions, content = opts.num_partitions, json.loads(json.dumps(opts.content_options(), default=str))
    journals = []
    for p in range(num_partitions):
        path = _journal_path(out, p)
        if not os.path.isfile(path):
            raise PrepError(f"partition {p} of {out} has not been built ({path} missing); run build --partition {p}")
        with open(path) as f:
            journal = json.load(f)
        if not journal["done"]:
            raise PrepError(f"partition {p} of {out} did not finish; run build --partition {p} again to resume it")
        journals.append(journal)
    stale = [p for p, j in enumerate(journals) if j["fingerprint"] != rec.get("fingerprint")]
    if stale:
        raise PrepError(f"partition{'s' * (len(stale) > 1)} {', '.join(map(str, stale))} of {out} "
                        f"{'were' if len(stale) > 1 else 'was'} built from other inputs or options than the last "
                        f"build's ({os.path.join(out, PARTIAL, 'build.json')}); run build --partition again for "
                        f"{'them' if len(stale) > 1 else 'it'} with those")
    tok = load_tokenizer(os.path.join(out, "tokenizer"))
    if content.get("dedup") and num_partitions > 1:
        extra = _dedup_across_partitions(out, journals)
    else:
        extra = 0
    shards = [{k: e[k] for k in ("file", "num_documents", "num_tokens", "num_sentences", "bytes", "sha256")}
              for j in journals for e in j["shards"] if e["file"]]
    stats = _new_stats()
    for j in journals:
        last = j["shards"][-1]["stats"] if j["shards"] else _new_stats()
        for k, v in last.items():
            if k == "skipped":
                for reason, n in v.items():
                    stats["skipped"][reason] = stats["skipped"].get(reason, 0) + n
            else:
                stats[k] += v
    stats["duplicates"] += extra
    stats["documents"] = sum(s["num_documents"] for s in shards)
    stats["tokens"] = sum(s["num_tokens"] for s in shards)
    if stats["documents"] == 0:
        raise PrepError(f"no documents left in {', '.join(content['inputs'])} after reading {stats['records']:,} "
                        f"records ({stats['filtered_short']:,} too short, {stats['filtered_long']:,} too long, "
                        f"{sum(stats['skipped'].values()):,} unreadable, {stats['duplicates']:,} duplicates); "
                        "check the inputs, --format, --text-field and length filters")
    max_label = -1
    for shard in shards:
        with pa.memory_map(os.path.join(out, shard["file"])) as src:
            labels = to_numpy(pa.ipc.open_file(src).get_batch(0).column("label"))
            max_label = max(max_label, int(labels.max()) if len(labels) else -1)
    rejects = [r for j in journals for e in j["shards"] for r in e["rejects"]]
    unlisted = sum(stats["skipped"].values()) - len(rejects)
    if unlisted > 0:
        rejects.append(f"... and {unlisted:,} more, not listed (at most {MAX_REJECTS_PER_SHARD:,} a shard)")
    if rejects:
        write_text(os.path.join(out, "rejects.txt"), "\n".join(rejects) + "\n")
    from data_prep.shards import COLUMNS, token_type
    from ptm import __version__

    manifest = {
        "format": "ptm-arrow",
        "format_version": FORMAT_VERSION,
        "ptm_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tokenizer": {**tok.meta(), "path": "tokenizer"},
        "vocab_size": tok.vocab_size,
        "special_ids": tok.special,
        "token_dtype": str(token_type(tok.vocab_size)),
        "num_documents": stats["documents"],
        "num_tokens": stats["tokens"],
        "num_sentences": sum(s["num_sentences"] for s in shards),
        "num_partitions": num_partitions,
        "num_labels": max_label + 1,  # classes of a labelled dataset (--label-field); 0 for plain text
        "columns": COLUMNS,
        "shards": shards,
        "sources": [{"path": os.path.abspath(f), "format": detect_format(f, content.get("format")),
                     "bytes": os.path.getsize(f)} for f in files],
        "stats": stats,
        "options": content,
    }
    write_json(os.path.join(out, MANIFEST), manifest)
    _finished(out)
    return manifest
