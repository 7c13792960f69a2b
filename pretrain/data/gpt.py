"""GPT-2 causal-LM samples: packed documents cut into fixed windows (Megatron's GPTDataset), or each
document on its own, padded.

Packed (default): each epoch puts the documents in a seeded order, follows each with the end-of-document
token and cuts the stream into windows of seq_len + 1 tokens that overlap by one (window i starts at token
i * seq_len); the windows are then read in a seeded shuffled order. Sample: input_ids = window[:-1],
labels = window[1:].
Streams (`streams=B`, a recurrent model's memory: Transformer-XL, XLNet): the windows are not shuffled but read as B
streams, each a contiguous run of them (`indexes.stream_order`), so that step t of a global batch of B holds window t
of every stream; samples carry `stream`, `stream_step` and `epoch`. `stride` spaces windows other than seq_len apart
(XLNet's reuse_len: consecutive samples of a stream share all but reuse_len tokens).
Unpacked (`pack=False`): a window never crosses a document's end: a document and its end-of-document token
are cut into windows that start every seq_len tokens, the last one padded ([PAD] inputs, or the end-of-document
token's where the tokenizer has no [PAD]: GPT-2's; labels -100), so samples carry different numbers of predicted
tokens.
"""
from __future__ import annotations

from functools import cached_property
from typing import NamedTuple

import numpy as np

from pretrain.data.indexes import Stream, document_windows, shuffle, stream_order, windows
from pretrain.data.source import CorpusSource


class GPTEpoch(NamedTuple):
    order: np.ndarray  # document positions (into `docs`) in this epoch's order
    windows: np.ndarray  # (n, 2) [position in `order`, token offset] where window i starts
    shuffle: np.ndarray  # sample index -> window


class GPTDataset(CorpusSource):
    """Windows of seq_len + 1 tokens over documents `docs` (default: all) of the dataset at `path`; packed
    across documents unless `pack` is False; starting every `stride` tokens (default seq_len), read as `streams`
    streams when that is given."""

    roles = ("eod",), "windows of packed documents (each one's end)"  # the special pieces the samples need, for what

    def __init__(self, path: str, seq_len: int, *, seed: int = 1234, docs=None, cache_dir: str | None = None,
                 pack: bool = True, stride: int | None = None, streams: int = 0):
        super().__init__(path, seed=seed, docs=docs, cache_dir=cache_dir)
        self.seq_len, self.pack, self.stride, self.streams = seq_len, pack, stride or seq_len, streams
        if streams and not pack:
            raise ValueError("streams of windows (a recurrent model's memory) need packed documents")
        self.eod = self.corpus.special(*self.roles[0], what=self.roles[1])[0]
        pad = self.corpus.special_ids.get("pad")
        self.pad = self.eod if pad is None else pad  # (never predicted nor attended to by a real token)
        stream = int(self._lengths().sum()) + len(self.docs)
        self._len = (stream - seq_len - 1) // self.stride + 1 if pack else len(self._documents)
        if self._len < 1:
            raise ValueError(f"{path}: {stream} tokens (with end-of-document tokens) do not fill one window "
                             f"of {seq_len + 1}")
        if streams:
            if self._len < streams:
                raise ValueError(f"{path}: {self._len} windows of {seq_len + 1} tokens do not give each of "
                                 f"{streams} streams (train.global_batch_size, with model.mem_len > 0) one")
            self._len -= self._len % streams

    def __len__(self) -> int:
        return self._len

    def _lengths(self) -> np.ndarray:
        return self.corpus.doc_lengths()[self.docs]

    @cached_property
    def _documents(self) -> np.ndarray:
        """Unpacked: (n, 2) [document position, offset] of every window, in document order."""
        return self.index("gpt-doc-windows", lambda: document_windows(self._lengths(), self.seq_len),
                          seq_len=self.seq_len)

    def _build_epoch(self, epoch: int) -> GPTEpoch:
        if not self.pack:
            return GPTEpoch(np.arange(len(self.docs)), self._documents,
                            self.index("gpt-shuffle", lambda: shuffle(len(self), Stream.SHUFFLE, self.seed, epoch),
                                       seed=self.seed, epoch=epoch, n=len(self)))
        order = self.index("gpt-order", lambda: shuffle(len(self.docs), Stream.DOC_ORDER, self.seed, epoch),
                           seed=self.seed, epoch=epoch)
        found = self.index("gpt-windows", lambda: windows(self._lengths()[order], self.seq_len, self.stride),
                           seed=self.seed, epoch=epoch, seq_len=self.seq_len,
                           **({"stride": self.stride} if self.stride != self.seq_len else {}))
        if self.streams:
            return GPTEpoch(order, found, stream_order(len(found), self.streams))
        return GPTEpoch(order, found,
                        self.index("gpt-shuffle", lambda: shuffle(len(self), Stream.SHUFFLE, self.seed, epoch),
                                   seed=self.seed, epoch=epoch, n=len(self)))

    def position(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        """A streamed sample's place: its stream, the step of the stream it is, its epoch (none without streams)."""
        if not self.streams:
            return {}
        return {"stream": np.int64(index % self.streams), "stream_step": np.int64(index // self.streams),
                "epoch": np.int64(epoch)}

    def sample(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        if not self.pack:
            e = self.epoch_index(epoch)
            pos, offset = (int(x) for x in e.windows[e.shuffle[index]])
            out = np.empty(self.seq_len + 1, dtype=np.int64)
            tokens = self.corpus.tokens(int(self.docs[e.order[pos]]))[offset:offset + len(out)]
            out[:len(tokens)] = tokens
            out[len(tokens):] = self.pad
            if len(tokens) < len(out):
                out[len(tokens)] = self.eod
            labels = out[1:].copy()
            labels[len(tokens):] = -100  # after the end-of-document token
            return {"input_ids": out[:-1], "labels": labels}
        out = self.packed(epoch, index, self.corpus.tokens, self.eod)
        return {"input_ids": out[:-1], "labels": out[1:], **self.position(epoch, index)}

    def packed(self, epoch: int, index: int, read, separator: int) -> np.ndarray:
        """A packed window's seq_len + 1 values of a per-token column (`read(document)`: its tokens, or e.g. its word
        starts), with `separator` at each end of a document (where the end-of-document token stands)."""
        e = self.epoch_index(epoch)
        pos, offset = (int(x) for x in e.windows[e.shuffle[index]])
        out = np.empty(self.seq_len + 1, dtype=np.int64)
        filled = 0
        while filled < len(out):
            values = read(int(self.docs[e.order[pos]]))[offset:offset + len(out) - filled]
            out[filled:filled + len(values)] = values
            filled += len(values)
            if filled < len(out):
                out[filled] = separator
                filled += 1
            pos, offset = pos + 1, 0
        return out
