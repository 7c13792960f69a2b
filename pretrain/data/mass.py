"""MASS's samples (Song et al. 2019): in each sentence of a run (`bart.DenoisingDataset`'s runs), one contiguous
fragment of round(0.5 x its length) tokens at a random start is masked in the encoder's input; the decoder sees, at
the fragment's positions, the fragment shifted right (the token before it first: the sentence's previous token, or
<s>), and the mask token everywhere else; it predicts the fragment (labels -100 elsewhere). Encoder and decoder
sequences are aligned: `<s> sentences </s>`, padded to seq_len. Draws from the sample's own generator."""
from __future__ import annotations

import numpy as np

from pretrain.data.bart import DenoisingDataset, pad
from pretrain.data.indexes import Stream, rng

FRAGMENT = 0.5


class MassDataset(DenoisingDataset):
    """MASS's samples of seq_len tokens: input_ids, attention_mask, labels, decoder_input_ids,
    decoder_attention_mask."""

    def __init__(self, path: str, seq_len: int, *, fragment: float = FRAGMENT, **kwargs):
        super().__init__(path, seq_len, **kwargs)
        self.fragment = fragment

    def sample(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        g = rng(Stream.SAMPLE, self.seed, epoch, index)
        pieces = self.sentences_of(epoch, index)
        tokens = np.concatenate(pieces).astype(np.int64)
        encoder, decoder, labels = tokens.copy(), np.full_like(tokens, self.mask), np.full_like(tokens, -100)
        at = 0
        for piece in pieces:
            k = max(1, int(round(len(piece) * self.fragment)))
            u = at + int(g.integers(0, len(piece) - k + 1))
            encoder[u:u + k] = self.mask
            labels[u:u + k] = tokens[u:u + k]
            decoder[u:u + k] = np.concatenate([[tokens[u - 1] if u > at else self.bos], tokens[u:u + k - 1]])
            at += len(piece)
        n = len(tokens) + 2

        def wrapped(middle, edge):
            return np.concatenate([[edge[0]], middle, [edge[1]]])
        return {"input_ids": pad(wrapped(encoder, (self.bos, self.eos)), self.seq_len, self.pad),
                "attention_mask": pad(np.ones(n, dtype=np.int64), self.seq_len, 0),
                "labels": pad(wrapped(labels, (-100, -100)), self.seq_len, -100),
                "decoder_input_ids": pad(wrapped(decoder, (self.mask, self.mask)), self.seq_len, self.pad),
                "decoder_attention_mask": pad(np.ones(n, dtype=np.int64), self.seq_len, 0)}
