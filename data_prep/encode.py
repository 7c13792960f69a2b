"""Turn normalised documents into the arrays stored per row: token ids, sentence starts, a word-start
mask (whole-word masking), and phrase/entity spans (ERNIE knowledge masking), all in token positions.

Work is done a chunk of documents at a time: the chunk's texts are joined (blank line between
documents) so that sentence and word finding, token positions and span mapping are one compiled loop
(data_prep/_structure.pyx) or a few numpy calls per chunk instead of per document.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from data_prep import text as T
from data_prep.chinese import Segmenter
from data_prep.tokenizer import Tokenizer

_WS = " \t\n\r\x0b\x0c\xa0\u3000"
_SEP = "\n\n"  # between documents of a chunk: ends phrases, and no word spans it


@dataclass
class EncodedChunk:
    """Encoded documents of one chunk: concatenated arrays plus per-document offsets (cheap to pickle
    between processes, unlike many small arrays)."""

    ids: np.ndarray
    word_start: np.ndarray
    tok_off: np.ndarray
    sentences: np.ndarray
    sent_off: np.ndarray
    phrases: np.ndarray
    phr_off: np.ndarray
    entities: np.ndarray
    ent_off: np.ndarray
    hashes: np.ndarray
    chars: np.ndarray
    unk: np.ndarray
    pair_start: np.ndarray

    def __len__(self) -> int:
        return len(self.hashes)

    def ragged(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The list columns of the shard schema as (values, per-document offsets into them)."""
        words = self.tok_off if len(self.word_start) else np.zeros_like(self.tok_off)
        return {"input_ids": (self.ids, self.tok_off), "sentence_starts": (self.sentences, self.sent_off),
                "word_start": (self.word_start, words), "phrase_spans": (self.phrases, self.phr_off),
                "entity_spans": (self.entities, self.ent_off)}


def doc_hash(text: str) -> int:
    """A 63-bit hash of the text (blake2b): equal texts, equal hashes."""
    return int(doc_hashes([text])[0])


def doc_hashes(texts: list[str]) -> np.ndarray:
    """doc_hash of each text (int64), the digests read as one array."""
    digests = b"".join(hashlib.blake2b(t.encode("utf-8"), digest_size=8).digest() for t in texts)
    return (np.frombuffer(digests, dtype="<u8") >> np.uint64(1)).astype(np.int64)


class DocEncoder:
    """Encodes normalised documents with a tokenizer; one per worker process."""

    def __init__(self, tokenizer: Tokenizer, opts: T.TextOptions, entities: list[str]):
        self.tok, self.opts = tokenizer, opts
        self._entity_list = entities
        self._cjk = None  # the dictionary loads (~0.1 s) only when CJK text shows up
        self._unk = tokenizer.special.get("unk", -1)
        cjk_entities = any(T.has_cjk(x) for x in entities)
        self._entities = T.EntityMatcher(entities, self._segmenter() if cjk_entities else None)

    def _segmenter(self) -> Segmenter:
        """jieba's words, with the entities that hold CJK text added to its dictionary (so that each comes out
        as one word)."""
        if self._cjk is None:
            self._cjk = Segmenter([e for e in self._entity_list if T.has_cjk(e)])
        return self._cjk

    def encode(self, texts: list[str], second: np.ndarray | None = None) -> EncodedChunk:
        """Encode documents whose text is already normalised and non-empty, recording the structure that
        `opts.structure` asks for (the other structure columns stay empty). `pair_start` is the first token of a
        document's second paragraph or, where `second` (characters, -1 for none) gives a labelled pair's second
        field, of the first sentence from there on."""
        if not T.has(self.opts.structure, "sentences"):
            return self._documents(texts)
        words = T.has(self.opts.structure, "words")
        # Sentences: sentencepiece and WordPiece ignore leading whitespace (a paragraph break would
        # become a "\n" piece in sentencepiece), byte-level BPE keeps it, as GPT-2 does.
        strip = not self.tok.keeps_leading_space
        doc_base = np.cumsum([0] + [len(t) + len(_SEP) for t in texts])[:-1]
        chunk = _SEP.join(texts)
        codes = T.code_points(chunk)
        spans = np.array(T.sentence_spans(chunk, set(doc_base[1:].tolist()), codes), dtype=np.int64).reshape(-1, 2)
        # a sentence's first non-space character, and whether it opens a paragraph (not the first)
        body, paragraph = T.sentence_bodies(codes, spans[:, 0])
        seg_base = body if strip else spans[:, 0]
        segments = [chunk[a:b] for a, b in zip(seg_base.tolist(), spans[:, 1].tolist())]
        seg_doc = np.searchsorted(doc_base, seg_base, side="right") - 1
        ids, counts, starts, ends = self.tok.encode(segments, offsets=words)
        doc_counts = np.bincount(seg_doc, weights=counts, minlength=len(texts)).astype(np.int64)
        doc_first = np.cumsum(doc_counts) - doc_counts
        out = self._chunk(texts, ids, doc_first)

        seg_first = np.cumsum(counts) - counts
        sent_doc = seg_doc[counts > 0]
        out.sentences = (seg_first[counts > 0] - doc_first[sent_doc]).astype(np.int32)
        out.sent_off = np.searchsorted(sent_doc, np.arange(len(texts) + 1))
        opens = paragraph & (counts > 0)
        if second is not None and (second >= 0).any():  # pairs: the paragraph where the second field starts
            at = second[seg_doc]
            opens &= (at < 0) | (body - doc_base[seg_doc] >= at)
        para_docs, first_para = np.unique(seg_doc[opens], return_index=True)
        out.pair_start[para_docs] = seg_first[opens][first_para] - doc_first[para_docs]
        if words:
            base = np.repeat(seg_base, counts)  # each token's segment's place in the chunk
            self._words(out, chunk, codes, doc_base, starts + base, ends + base, doc_first)
        return out

    def _documents(self, texts: list[str]) -> EncodedChunk:
        """Structure `none`: each document tokenized whole, as a GPT-style corpus needs."""
        ids, counts, _, _ = self.tok.encode(texts, offsets=False)
        return self._chunk(texts, ids, np.cumsum(counts) - counts)

    def _chunk(self, texts: list[str], ids: np.ndarray, doc_first: np.ndarray) -> EncodedChunk:
        """The documents' tokens and per-document facts, with every structure column empty."""
        n = len(texts)
        none, offsets = np.zeros(0, np.int32), np.zeros(n + 1, np.int64)
        return EncodedChunk(
            ids=ids.astype(np.uint16 if self.tok.vocab_size <= 1 << 16 else np.int32),
            word_start=np.zeros(0, np.uint8), tok_off=np.append(doc_first, len(ids)),
            sentences=none, sent_off=offsets, phrases=none, phr_off=offsets, entities=none, ent_off=offsets,
            hashes=doc_hashes(texts),
            chars=np.fromiter(map(len, texts), dtype=np.int64, count=n),
            unk=np.diff(np.searchsorted(np.flatnonzero(ids == self._unk), np.append(doc_first, len(ids)))),
            pair_start=np.zeros(n, dtype=np.int32),
        )

    def _words(self, out: EncodedChunk, chunk: str, codes: np.ndarray, doc_base: np.ndarray, starts: np.ndarray,
               ends: np.ndarray, doc_first: np.ndarray) -> None:
        """Word starts (structure `words`) and phrase and entity spans (`full`) of the chunk's tokens, whose
        character [starts, ends) in `chunk` (code points `codes`) are given."""
        doc_counts = np.diff(out.tok_off)
        cjk = self._segmenter() if len(codes) and codes.max() >= T.FIRST_CJK else None  # one fast pass rules most out
        wstarts, wends = T.word_spans(chunk, cjk, codes)
        pos, out.word_start = T.token_positions(codes, starts, ends, wstarts, _WS)
        out.word_start[doc_first[doc_counts > 0]] = 1
        if not T.has(self.opts.structure, "full"):
            return
        n = len(doc_first)
        phrases = _token_spans(pos, T.phrase_spans(chunk, wstarts, wends, self.opts.max_phrase_words, codes))
        out.phrases, out.phr_off = _per_doc(phrases, doc_first, n)
        if self._entities.table:  # per document, so no entity spans two documents
            b = np.searchsorted(wstarts, np.append(doc_base, len(chunk) + 1))
            found = [sp for d in range(n) for sp in self._entities(chunk, wstarts[b[d]:b[d + 1]], wends[b[d]:b[d + 1]])]
            entities = _token_spans(pos, np.asarray(found, dtype=np.int64).reshape(-1, 2))
            out.entities, out.ent_off = _per_doc(entities, doc_first, n)


def _per_doc(spans: np.ndarray, doc_first: np.ndarray, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """Spans in chunk token positions -> (flattened document-local pairs, per-document offsets)."""
    doc = np.searchsorted(doc_first, spans[:, 0], side="right") - 1
    local = (spans - doc_first[doc][:, None]).astype(np.int32).reshape(-1)
    return local, 2 * np.searchsorted(doc, np.arange(n_docs + 1))


def _token_spans(pos: np.ndarray, char_spans: np.ndarray) -> np.ndarray:
    """(n, 2) character spans -> token [start, end): the tokens whose position lies in the span."""
    tok = np.searchsorted(pos, char_spans, side="left")
    return tok[tok[:, 1] > tok[:, 0]]
