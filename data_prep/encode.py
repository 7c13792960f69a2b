"""Turn one normalised document into the arrays stored per row: token ids, sentence starts, a word-start
mask (whole-word masking), and phrase/entity spans (ERNIE knowledge masking), all in token positions."""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import numpy as np

from data_prep import text as T
from data_prep.tokenizer import Tokenizer

_WS = np.array([ord(c) for c in " \t\n\r\x0b\x0c\xa0\u3000"], dtype=np.uint32)


@dataclass
class EncodedDoc:
    input_ids: np.ndarray  # int64, narrowed when written
    sentence_starts: np.ndarray  # int32 token index of each sentence's first token
    word_start: np.ndarray  # uint8, 1 where a token begins a word
    phrase_spans: np.ndarray  # int32 [start0, end0, start1, end1, ...], end exclusive
    entity_spans: np.ndarray  # int32, same layout
    doc_hash: int  # 64-bit hash of the normalised text (exact de-duplication)
    chars: int
    unk: int  # tokens mapped to [UNK]


def doc_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little") >> 1


def _cjk_segmenter(entities: list[str]):
    import jieba

    jieba.setLogLevel(logging.WARNING)
    seg = jieba.Tokenizer()
    for ent in entities:
        if T.has_cjk(ent):
            seg.add_word(ent, freq=10**6)
    return lambda s: list(seg.cut(s, HMM=False))  # HMM finds unknown words at 3x the cost


class DocEncoder:
    """Encodes normalised documents with a tokenizer; one per worker process."""

    def __init__(self, tokenizer: Tokenizer, opts: T.TextOptions, entities: list[str]):
        self.tok, self.opts = tokenizer, opts
        self._entity_list = entities
        self._cjk = None  # jieba loads its dictionary (~1 s) only when CJK text shows up
        self._unk = tokenizer.special.get("unk", -1)
        cjk_entities = any(T.has_cjk(x) for x in entities)
        self._entities = T.EntityMatcher(entities, self._segmenter() if cjk_entities else None)

    def _segmenter(self):
        if self._cjk is None:
            self._cjk = _cjk_segmenter(self._entity_list)
        return self._cjk

    def encode(self, texts: list[str]) -> list[EncodedDoc]:
        """Encode documents whose text is already normalised and non-empty."""
        segs = [T.split_sentences(t) for t in texts]
        # sentencepiece and WordPiece ignore leading whitespace (a paragraph break would become a "\n"
        # piece in sentencepiece); byte-level BPE keeps it, as GPT-2 does.
        strip = self.tok.kind != "bpe"
        flat = [s.lstrip() if strip else s for ss in segs for s in ss]
        encoded = iter(self.tok.encode(flat))
        return [self._one(t, ss, [next(encoded) for _ in ss]) for t, ss in zip(texts, segs)]

    def _one(self, text: str, segments: list[str], enc) -> EncodedDoc:
        ids_parts, off_parts, starts = [], [], []
        n_tok = char0 = 0
        strip = self.tok.kind != "bpe"
        for seg, (ids, offs) in zip(segments, enc):
            if len(ids):
                starts.append(n_tok)
                ids_parts.append(ids)
                off_parts.append(offs + char0 + (len(seg) - len(seg.lstrip()) if strip else 0))
                n_tok += len(ids)
            char0 += len(seg)
        ids = np.concatenate(ids_parts) if ids_parts else np.zeros(0, np.int64)
        offs = np.concatenate(off_parts) if off_parts else np.zeros((0, 2), np.int64)
        # Position of each token in the text: its last character, or for a whitespace-only or
        # zero-width piece (sentencepiece's "▁", the leading bytes of a byte-fallback character) the
        # character after it, so such pieces belong to the word that follows.
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        content = np.concatenate([[0], np.cumsum(~np.isin(codes, _WS))])
        s, e = offs[:, 0], offs[:, 1]
        pos = np.where(content[e] > content[s], e - 1, e)

        cjk = self._segmenter() if T.has_cjk(text) else None
        wspans = T.words(text, cjk)
        wstarts = np.fromiter((a for a, _ in wspans), dtype=np.int64, count=len(wspans))
        widx = np.searchsorted(wstarts, pos, side="right")
        word_start = np.ones(len(ids), dtype=np.uint8)
        word_start[1:] = widx[1:] != widx[:-1]
        return EncodedDoc(
            input_ids=ids,
            sentence_starts=np.asarray(starts, dtype=np.int32),
            word_start=word_start,
            phrase_spans=_token_spans(pos, T.phrases(text, wspans, self.opts.max_phrase_words)),
            entity_spans=_token_spans(pos, self._entities(text, wspans)),
            doc_hash=doc_hash(text),
            chars=len(text),
            unk=int(np.count_nonzero(ids == self._unk)),
        )


def _token_spans(pos: np.ndarray, char_spans: list[tuple[int, int]]) -> np.ndarray:
    if not char_spans:
        return np.zeros(0, np.int32)
    cs = np.asarray(char_spans, dtype=np.int64)
    tok = np.searchsorted(pos, cs, side="left")
    tok = tok[tok[:, 1] > tok[:, 0]]
    return tok.astype(np.int32).reshape(-1)
