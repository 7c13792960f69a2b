"""GPT-2 causal-LM samples: packed documents cut into fixed windows (Megatron's GPTDataset).

Each epoch puts the documents in a seeded order, follows each with the end-of-document token and cuts
the stream into windows of seq_len + 1 tokens that overlap by one (window i starts at token i * seq_len);
the windows are then read in a seeded shuffled order. Sample: input_ids = window[:-1], labels = window[1:].
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pretrain.data.indexes import Stream, shuffle, windows
from pretrain.data.source import CorpusSource


class GPTEpoch(NamedTuple):
    order: np.ndarray  # document positions (into `docs`) in this epoch's order
    windows: np.ndarray  # (n, 2) [position in `order`, token offset] where window i starts
    shuffle: np.ndarray  # sample index -> window


class GPTDataset(CorpusSource):
    """Windows of seq_len + 1 tokens over documents `docs` (default: all) of the dataset at `path`."""

    def __init__(self, path: str, seq_len: int, *, seed: int = 1234, docs=None, cache_dir: str | None = None):
        super().__init__(path, seed=seed, docs=docs, cache_dir=cache_dir)
        self.seq_len = seq_len
        self.eod = self.corpus.special_ids["eod"]
        stream = int(self._lengths().sum()) + len(self.docs)
        self._len = (stream - 1) // seq_len
        if self._len < 1:
            raise ValueError(f"{path}: {stream} tokens (with end-of-document tokens) do not fill one window "
                             f"of {seq_len + 1}")

    def __len__(self) -> int:
        return self._len

    def _lengths(self) -> np.ndarray:
        return self.corpus.doc_lengths()[self.docs]

    def _build_epoch(self, epoch: int) -> GPTEpoch:
        order = self.index("gpt-order", lambda: shuffle(len(self.docs), Stream.DOC_ORDER, self.seed, epoch),
                           seed=self.seed, epoch=epoch)
        return GPTEpoch(order,
                        self.index("gpt-windows", lambda: windows(self._lengths()[order], self.seq_len),
                                   seed=self.seed, epoch=epoch, seq_len=self.seq_len),
                        self.index("gpt-shuffle", lambda: shuffle(len(self), Stream.SHUFFLE, self.seed, epoch),
                                   seed=self.seed, epoch=epoch, n=len(self)))

    def sample(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        e = self.epoch_index(epoch)
        pos, offset = (int(x) for x in e.windows[e.shuffle[index]])
        out = np.empty(self.seq_len + 1, dtype=np.int64)
        filled = 0
        while filled < len(out):
            tokens = self.corpus.tokens(int(self.docs[e.order[pos]]))[offset:offset + len(out) - filled]
            out[filled:filled + len(tokens)] = tokens
            filled += len(tokens)
            if filled < len(out):
                out[filled] = self.eod
                filled += 1
            pos, offset = pos + 1, 0
        return {"input_ids": out[:-1], "labels": out[1:]}
