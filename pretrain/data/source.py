"""The base of the sample sources: one dataset directory, a document subset, its cached index maps.

A source has `len(source)` samples per epoch and `source.sample(epoch, index)`: a dict of numpy arrays
that is a pure function of the dataset, the parameters, the seed, the epoch and the index. `prepare(epoch)`
builds (or maps) that epoch's index maps ahead of use. Sources pickle without their memory maps: a loader
worker started with spawn reopens the shards and indexes instead of receiving copies.
"""
from __future__ import annotations

import hashlib
from functools import cached_property

import numpy as np

from data_prep.dataset import Corpus
from data_prep.text import has
from pretrain.data.indexes import IndexCache, sentence_table


class Lazy:
    """Pickles without its cached properties (open shards, memory-mapped indexes); the copy rebuilds them."""

    def __getstate__(self):
        lazy = {name for cls in type(self).__mro__ for name, v in vars(cls).items() if isinstance(v, cached_property)}
        return {k: v for k, v in self.__dict__.items() if k not in lazy}


class CorpusSource(Lazy):
    """Samples from documents `docs` (default: all) of the dataset at `path`; subclasses define
    `__len__`, `sample(epoch, index)` and `_build_epoch(epoch)` (that epoch's index maps)."""

    def __init__(self, path: str, *, seed: int, docs=None, cache_dir: str | None = None):
        if seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed}")
        self.path, self.seed = path, seed
        self.docs = np.arange(len(self.corpus)) if docs is None else np.asarray(docs, dtype=np.int64)
        if not len(self.docs):
            raise ValueError(f"{path}: no documents to sample from (is the split empty?)")
        self.cache = IndexCache(path, self.corpus.manifest, cache_dir)
        self._docs_digest = hashlib.sha256(self.docs.tobytes()).hexdigest()[:20]

    @cached_property
    def corpus(self) -> Corpus:
        return Corpus(self.path)

    @cached_property
    def _epochs(self) -> dict:
        return {}

    @cached_property
    def sentences(self) -> np.ndarray:
        """(3, S) int32 [document position, first token, end token] of every sentence of this source's documents."""
        return self.index("sentences", lambda: sentence_table(*ragged(self.corpus, "sentence_starts"),
                                                              self.corpus.doc_lengths(), self.docs))

    def require(self, level: str, what: str) -> None:
        """Refuse a dataset built without the structure `level` (data_prep.text.STRUCTURES) that `what` needs."""
        built = self.corpus.structure
        if not has(built, level):
            raise ValueError(f"{self.path} was built with --structure {built}, without the {level} that {what} needs; "
                             f"rebuild it with `data_prep build --structure {level}` (or a fuller level)")

    def index(self, name: str, build, **params) -> np.ndarray:
        """The cached index map `name` over this source's documents for `params`."""
        return self.cache.get(name, {**params, "docs": self._docs_digest}, build)

    def epoch_index(self, epoch: int):
        """That epoch's index maps, built or mapped once; the two latest epochs are kept."""
        if epoch not in self._epochs:
            if len(self._epochs) >= 2:
                del self._epochs[min(self._epochs)]
            self._epochs[epoch] = self._build_epoch(epoch)
        return self._epochs[epoch]

    def prepare(self, epoch: int) -> None:
        self.epoch_index(epoch)


def ragged(corpus, column: str) -> tuple[np.ndarray, np.ndarray]:
    """A list column of every shard as one (offsets per corpus document, values) pair."""
    offsets, values, base = [np.zeros(1, dtype=np.int64)], [], 0
    for shard in corpus.shards:
        off = shard.offsets[column].astype(np.int64)
        values.append(shard.values[column][off[0]:off[-1]])
        offsets.append(off[1:] - off[0] + base)
        base += int(off[-1] - off[0])
    return np.concatenate(offsets), np.concatenate(values)
