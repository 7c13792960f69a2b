"""`verify`: a dataset is valid only if its manifest, tokenizer, shard hashes, schema and counts agree."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa

from data_prep.build import FORMAT_VERSION, MANIFEST, PARTIAL
from data_prep.dataset import structure_of
from data_prep.shards import SHARD_SUFFIX, schema
from data_prep.text import has
from ptm.files import sha256_file


def _check_lists(name: str, off: np.ndarray, vals: np.ndarray, lengths: np.ndarray, spans: bool) -> str | None:
    """Positions stored per document must lie inside that document; starts increase, spans are pairs."""
    counts = np.diff(off)
    if spans and (counts % 2).any():
        return f"{name}: odd number of span bounds"
    doc = np.repeat(np.arange(len(counts)), counts)
    if len(vals) and ((vals < 0).any() or (vals > lengths[doc]).any()):
        return f"{name}: position outside its document"
    if spans:
        pairs = vals.reshape(-1, 2)
        if len(pairs) and (pairs[:, 1] <= pairs[:, 0]).any():
            return f"{name}: empty or reversed span"
    else:
        if len(vals) and (vals >= lengths[doc]).any():
            return f"{name}: start at or past the document's end"
        first = off[:-1][counts > 0]
        if len(first) and vals[first].any():
            return f"{name}: first sentence does not start at token 0"
        inner = np.ones(len(vals), dtype=bool)
        inner[first] = False
        if len(vals) > 1 and (np.diff(vals)[inner[1:]] <= 0).any():
            return f"{name}: starts not increasing"
    return None


def verify_shard(path: str, entry: dict, vocab_size: int, structure: str = "full") -> list[str]:
    """Problems of one shard: hash, schema, counts against its manifest entry, token ids, and the structure
    columns (filled as far as `structure` goes, empty beyond)."""
    name, size = entry["file"], os.path.getsize(path)
    if size != entry["bytes"]:
        return [f"{name}: " + (f"truncated ({size:,} of {entry['bytes']:,} bytes)" if size < entry["bytes"] else
                               f"{size:,} bytes, the manifest says {entry['bytes']:,}")]
    if sha256_file(path) != entry["sha256"]:
        return [f"{name}: sha256 differs from the manifest (corrupt or modified shard)"]
    try:
        reader = pa.ipc.open_file(pa.memory_map(path))
        batch = reader.get_batch(0)
    except (pa.ArrowInvalid, OSError) as e:
        return [f"{name}: not a readable Arrow IPC file ({e})"]
    expected = schema(vocab_size)
    if not batch.schema.equals(expected) or reader.num_record_batches != 1:
        return [f"{name}: schema differs from ptm-arrow-v{FORMAT_VERSION}"]
    ids = batch.column("input_ids")
    off = ids.offsets.to_numpy()
    lengths = np.diff(off)
    problems = []
    counts = {"num_documents": batch.num_rows, "num_tokens": int(off[-1] - off[0]),
              "num_sentences": len(batch.column("sentence_starts").values)}
    problems += [f"{name}: {k} is {v}, manifest says {entry[k]}" for k, v in counts.items() if v != entry[k]]
    values = ids.values.to_numpy()
    if len(values) and int(values.max()) >= vocab_size:
        problems.append(f"{name}: token id {int(values.max())} >= vocab size {vocab_size}")
    words = batch.column("word_start").offsets.to_numpy()
    if not np.array_equal(words, off if has(structure, "words") else np.zeros_like(words)):
        problems.append(f"{name}: word_start length differs from input_ids" if has(structure, "words")
                        else f"{name}: word_start is filled, but the manifest says --structure {structure}")
    for col, spans, level in (("sentence_starts", False, "sentences"), ("phrase_spans", True, "full"),
                              ("entity_spans", True, "full")):
        arr = batch.column(col)
        if not has(structure, level) and len(arr.values):
            problems.append(f"{name}: {col} is filled, but the manifest says --structure {structure}")
        elif (p := _check_lists(f"{name}: {col}", arr.offsets.to_numpy(), arr.values.to_numpy(), lengths, spans)):
            problems.append(p)
    return problems


def verify(directory: str) -> list[str]:
    """All problems found in `directory`; empty means valid."""
    if not os.path.isdir(directory):
        return [f"{directory}: no such directory"]
    mpath = os.path.join(directory, MANIFEST)
    if not os.path.isfile(mpath):
        hint = " (an unfinished build: re-run it to resume)" if os.path.isdir(os.path.join(directory, PARTIAL)) else ""
        return [f"{directory}: no {MANIFEST}{hint}"]
    try:
        with open(mpath) as f:
            m = json.load(f)
        shards, vocab = m["shards"], m["vocab_size"]
    except (ValueError, KeyError, TypeError) as e:  # not JSON, or not a ptm manifest (another tool's)
        return [f"{mpath}: unreadable manifest ({e})"]
    if m.get("format_version") != FORMAT_VERSION:
        return [f"{mpath}: format_version {m.get('format_version')} is not {FORMAT_VERSION}"]
    problems = []
    if os.path.isdir(os.path.join(directory, PARTIAL)):
        problems.append(f"{directory}: {PARTIAL}/ present: a build is still writing here, or its end was cut short "
                        "(re-run the build or `finalize` to finish it)")
    from data_prep.tokenizer import load_tokenizer

    try:
        tok = load_tokenizer(os.path.join(directory, "tokenizer"))
        if tok.sha256() != m["tokenizer"]["sha256"]:
            problems.append("tokenizer: files differ from the manifest's sha256")
        elif tok.vocab_size != vocab:
            problems.append(f"tokenizer: vocab size {tok.vocab_size} differs from manifest {vocab}")
    except Exception as e:  # any failure to load is a verification failure, reported as such
        problems.append(f"tokenizer: cannot be loaded ({e})")
    listed = {s["file"] for s in shards}
    for name in sorted(os.listdir(directory)):
        if name.endswith(SHARD_SUFFIX) and name not in listed:
            problems.append(f"{name}: shard not listed in the manifest")
    for entry in shards:
        path = os.path.join(directory, entry["file"])
        if not os.path.isfile(path):
            problems.append(f"{entry['file']}: missing")
            continue
        problems += verify_shard(path, entry, vocab, structure_of(m))
    for key, shard_key in (("num_documents", "num_documents"), ("num_tokens", "num_tokens")):
        if sum(s[shard_key] for s in shards) != m[key]:
            problems.append(f"manifest: {key} {m[key]} is not the sum over shards")
    return problems
