"""Read a finished dataset: every shard memory-mapped, every document a zero-copy numpy view.

    corpus = Corpus("data/wiki")
    ids = corpus.tokens(123)                 # numpy view into the mapped shard
    lengths = corpus.doc_lengths()           # all document lengths, from the list offsets alone
"""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa

from data_prep import PrepError

_LIST_COLUMNS = ("input_ids", "sentence_starts", "word_start", "phrase_spans", "entity_spans")


def structure_of(manifest: dict) -> str:
    """A manifest's `--structure` (datasets built before the option recorded everything)."""
    return manifest.get("options", {}).get("text", {}).get("structure", "full")


def _open_shard(directory: str, entry: dict) -> pa.RecordBatch:
    """A shard's record batch, memory-mapped, after cheap checks against its manifest entry (file size,
    Arrow IPC footer, row count); hashing every byte is left to `verify`."""
    path = os.path.join(directory, entry["file"])

    def damaged(problem: str) -> PrepError:
        return PrepError(f"{path}: {problem}; the dataset is damaged: run `python -m data_prep verify {directory}` "
                         "and rebuild it")

    if not os.path.isfile(path):
        raise damaged("missing")
    size, expected = os.path.getsize(path), entry["bytes"]
    if size != expected:
        raise damaged(f"truncated ({size:,} of {expected:,} bytes)" if size < expected
                      else f"{size:,} bytes, the manifest says {expected:,}")
    try:
        batch = pa.ipc.open_file(pa.memory_map(path)).get_batch(0)
    except (pa.ArrowException, OSError) as e:
        raise damaged(f"not a readable Arrow IPC file ({(str(e).splitlines() or [type(e).__name__])[0]})") from None
    if batch.num_rows != entry["num_documents"]:
        raise damaged(f"{batch.num_rows:,} documents, the manifest says {entry['num_documents']:,}")
    return batch


class _Shard:
    def __init__(self, directory: str, entry: dict):
        self.batch = _open_shard(directory, entry)
        self.offsets, self.values = {}, {}
        for name in _LIST_COLUMNS:
            col = self.batch.column(name)
            self.offsets[name] = col.offsets.to_numpy(zero_copy_only=True)
            self.values[name] = col.values.to_numpy(zero_copy_only=True)

    def row(self, name: str, i: int) -> np.ndarray:
        off = self.offsets[name]
        return self.values[name][off[i] : off[i + 1]]


class Corpus:
    """A ptm dataset directory: `manifest.json`, Arrow shards and the tokenizer."""

    def __init__(self, path: str):
        manifest = os.path.join(path, "manifest.json")
        if not os.path.exists(path):
            raise PrepError(f"{path} does not exist; set it to a dataset built by `python -m data_prep build`")
        if not os.path.isfile(manifest):
            raise PrepError(f"{path} is not a finished ptm dataset (no manifest.json); build it with "
                            "`python -m data_prep build`, or re-run an interrupted build to complete it")
        try:
            with open(manifest) as f:
                self.manifest = json.load(f)
        except (OSError, ValueError) as e:  # ValueError: not JSON, or not even text
            raise PrepError(f"{manifest} is unreadable ({str(e).splitlines()[0]}); the dataset is damaged: run "
                            f"`python -m data_prep verify {path}` and rebuild it") from None
        if not isinstance(self.manifest, dict) or not {"shards", "tokenizer"} <= self.manifest.keys():
            raise PrepError(f"{manifest} is not a ptm dataset's manifest (another tool's?); pass a dataset built by "
                            "`python -m data_prep build`")
        self.path = path
        self.shards = [_Shard(path, s) for s in self.manifest["shards"]]
        counts = [s.batch.num_rows for s in self.shards]
        self._first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self._first[-1])

    @property
    def structure(self) -> str:
        """What the build recorded (`build --structure`; data_prep.text.STRUCTURES)."""
        return structure_of(self.manifest)

    @property
    def vocab_size(self) -> int:
        return self.manifest["vocab_size"]

    @property
    def special_ids(self) -> dict:
        return self.manifest["special_ids"]

    def special(self, *roles: str, what: str) -> list[int]:
        """The ids of special `roles` (pad, cls, sep, mask, eod), or one line naming the pieces `what` lacks."""
        from data_prep.tokenizer import role_ids

        return role_ids(self.special_ids, roles, what, self.path)

    @property
    def sentinel_ids(self) -> list[int]:
        """T5's `<extra_id_k>` ids, k = 0, 1, ...: counting down from the last id (none unless built with
        --sentinels; data_prep.tokenizer.sentinel_ids)."""
        return [self.vocab_size - 1 - k for k in range(self.manifest["tokenizer"].get("sentinels", 0))]

    def _locate(self, i: int) -> tuple[_Shard, int]:
        if not 0 <= i < len(self):
            raise IndexError(f"document {i} out of range 0..{len(self) - 1}")
        s = int(np.searchsorted(self._first, i, side="right")) - 1
        return self.shards[s], i - int(self._first[s])

    def _column(self, name: str, i: int) -> np.ndarray:
        shard, row = self._locate(i)
        return shard.row(name, row)

    def tokens(self, i: int) -> np.ndarray:
        return self._column("input_ids", i)

    def sentence_starts(self, i: int) -> np.ndarray:
        return self._column("sentence_starts", i)

    def word_start(self, i: int) -> np.ndarray:
        return self._column("word_start", i)

    def phrase_spans(self, i: int) -> np.ndarray:
        return self._column("phrase_spans", i).reshape(-1, 2)

    def entity_spans(self, i: int) -> np.ndarray:
        return self._column("entity_spans", i).reshape(-1, 2)

    def pair_start(self, i: int) -> int:
        """Token index where document i's second paragraph (segment B of a labelled pair) starts; 0 if none."""
        shard, row = self._locate(i)
        return int(shard.batch.column("pair_start")[row].as_py())

    def label(self, i: int) -> int:
        """Class id of document i when the dataset was built with --label-field; -1 otherwise."""
        shard, row = self._locate(i)
        return int(shard.batch.column("label")[row].as_py())

    def labels(self) -> np.ndarray:
        """Every document's class id (-1 where none)."""
        return np.concatenate([s.batch.column("label").to_numpy() for s in self.shards])

    def doc_lengths(self) -> np.ndarray:
        """Token count of every document (int64), computed from the shards' list offsets."""
        return np.concatenate([np.diff(s.offsets["input_ids"]) for s in self.shards]).astype(np.int64)

    def tokenizer(self):
        from data_prep.tokenizer import load_tokenizer

        return load_tokenizer(os.path.join(self.path, "tokenizer"))
