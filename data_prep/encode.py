"""Turn normalised documents into the arrays stored per row: token ids, sentence starts, a word-start
mask (whole-word masking), and phrase/entity spans (ERNIE knowledge masking), all in token positions.

Work is done a chunk of documents at a time: the chunk's texts are joined (blank line between
documents) so that word finding, token positions and span mapping are a few numpy calls per chunk
instead of per document.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from data_prep import text as T
from data_prep.tokenizer import Tokenizer

_WS = np.array([ord(c) for c in " \t\n\r\x0b\x0c\xa0\u3000"], dtype=np.uint32)
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

    def doc(self, i: int) -> "EncodedDoc":
        a, b = self.tok_off[i], self.tok_off[i + 1]
        return EncodedDoc(
            input_ids=self.ids[a:b], word_start=self.word_start[a:b],
            sentence_starts=self.sentences[self.sent_off[i]:self.sent_off[i + 1]],
            phrase_spans=self.phrases[self.phr_off[i]:self.phr_off[i + 1]],
            entity_spans=self.entities[self.ent_off[i]:self.ent_off[i + 1]],
            doc_hash=int(self.hashes[i]), chars=int(self.chars[i]), unk=int(self.unk[i]),
            pair_start=int(self.pair_start[i]))


@dataclass
class EncodedDoc:
    input_ids: np.ndarray  # int64, narrowed when written
    sentence_starts: np.ndarray  # int32 token index of each sentence's first token
    word_start: np.ndarray  # uint8, 1 where a token begins a word
    phrase_spans: np.ndarray  # int32 [start0, end0, start1, end1, ...], end exclusive
    entity_spans: np.ndarray  # int32, same layout
    doc_hash: int  # 63-bit hash of the normalised text (exact de-duplication)
    chars: int
    unk: int  # tokens mapped to [UNK]
    pair_start: int = 0  # token index where the second paragraph starts, 0 if none


def doc_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little") >> 1


def _cjk_segmenter(entities: list[str]):
    """Chinese word segmentation with jieba's dictionary (rjieba, the Rust port: ~10x faster than jieba);
    entities are added to the dictionary so they come out as single words."""
    import rjieba

    seg = rjieba.Jieba()
    for ent in entities:
        if T.has_cjk(ent):
            seg.add_word(ent, 10**6, None)
    return lambda s: seg.cut(s, False)  # no HMM: unknown words split into characters, at a third of the cost


class DocEncoder:
    """Encodes normalised documents with a tokenizer; one per worker process."""

    def __init__(self, tokenizer: Tokenizer, opts: T.TextOptions, entities: list[str]):
        self.tok, self.opts = tokenizer, opts
        self._entity_list = entities
        self._cjk = None  # the dictionary loads (~0.3 s) only when CJK text shows up
        self._unk = tokenizer.special.get("unk", -1)
        cjk_entities = any(T.has_cjk(x) for x in entities)
        self._entities = T.EntityMatcher(entities, self._segmenter() if cjk_entities else None)

    def _segmenter(self):
        if self._cjk is None:
            self._cjk = _cjk_segmenter(self._entity_list)
        return self._cjk

    def encode(self, texts: list[str]) -> EncodedChunk:
        """Encode documents whose text is already normalised and non-empty."""
        # Sentences: sentencepiece and WordPiece ignore leading whitespace (a paragraph break would
        # become a "\n" piece in sentencepiece), byte-level BPE keeps it, as GPT-2 does.
        strip = self.tok.kind != "bpe"
        doc_base = np.cumsum([0] + [len(t) + len(_SEP) for t in texts])[:-1]
        chunk = _SEP.join(texts)
        spans = T.sentence_spans(chunk, doc_starts=set(doc_base[1:].tolist()))
        segments, seg_base = [], np.zeros(len(spans), dtype=np.int64)
        paragraph = np.zeros(len(spans), dtype=bool)  # a sentence that opens a paragraph (not the first)
        for i, (a, b) in enumerate(spans):
            seg = chunk[a:b]
            body = seg.lstrip()
            paragraph[i] = "\n" in seg[:len(seg) - len(body)]
            segments.append(body if strip else seg)
            seg_base[i] = b - len(segments[-1])
        seg_doc = np.searchsorted(doc_base, seg_base, side="right") - 1
        ids, counts, starts, ends = self.tok.encode(segments)
        seg_of = np.repeat(np.arange(len(segments)), counts)
        starts = starts + seg_base[seg_of]
        ends = ends + seg_base[seg_of]

        # Position of each token in the chunk: its last character, or for a whitespace-only or zero-width
        # piece (sentencepiece's lone "▁") the character after it, so it joins the word that follows.
        codes = np.frombuffer(chunk.encode("utf-32-le"), dtype=np.uint32)
        content = np.concatenate([[0], np.cumsum(~np.isin(codes, _WS))])
        pos = np.where(content[ends] > content[starts], ends - 1, ends)

        doc_counts = np.bincount(seg_doc, weights=counts, minlength=len(texts)).astype(np.int64)
        doc_first = np.cumsum(doc_counts) - doc_counts
        wstarts, wends = T.word_spans(chunk, self._segmenter() if T.has_cjk(chunk) else None)
        widx = np.searchsorted(wstarts, pos, side="right")
        word_start = np.ones(len(ids), dtype=np.uint8)
        word_start[1:] = widx[1:] != widx[:-1]
        word_start[doc_first[doc_counts > 0]] = 1

        phrases = _token_spans(pos, T.phrase_spans(chunk, wstarts, wends, self.opts.max_phrase_words))
        entities = np.zeros((0, 2), np.int64)
        if self._entities.table:  # per document, so no entity spans two documents
            b = np.searchsorted(wstarts, np.append(doc_base, len(chunk) + 1))
            found = [sp for d in range(len(texts))
                     for sp in self._entities(chunk, wstarts[b[d]:b[d + 1]], wends[b[d]:b[d + 1]])]
            entities = _token_spans(pos, np.asarray(found, dtype=np.int64).reshape(-1, 2))

        seg_first = np.cumsum(counts) - counts
        sent_doc = seg_doc[counts > 0]
        tok_doc = np.repeat(np.arange(len(texts)), doc_counts)
        opens = paragraph & (counts > 0)
        para_docs, first_para = np.unique(seg_doc[opens], return_index=True)
        pair_start = np.zeros(len(texts), dtype=np.int32)
        pair_start[para_docs] = seg_first[opens][first_para] - doc_first[para_docs]
        return EncodedChunk(
            ids=ids.astype(np.uint16 if self.tok.vocab_size <= 1 << 16 else np.int32), word_start=word_start,
            tok_off=np.append(doc_first, len(ids)),
            sentences=(seg_first[counts > 0] - doc_first[sent_doc]).astype(np.int32),
            sent_off=np.searchsorted(sent_doc, np.arange(len(texts) + 1)),
            **_per_doc("phrases", phrases, doc_first, len(texts)),
            **_per_doc("entities", entities, doc_first, len(texts)),
            hashes=np.fromiter(map(doc_hash, texts), dtype=np.int64, count=len(texts)),
            chars=np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)),
            unk=np.bincount(tok_doc, weights=ids == self._unk, minlength=len(texts)).astype(np.int64),
            pair_start=pair_start,
        )


def _per_doc(name: str, spans: np.ndarray, doc_first: np.ndarray, n_docs: int) -> dict:
    """Spans in chunk token positions -> flattened document-local pairs and per-document offsets."""
    doc = np.searchsorted(doc_first, spans[:, 0], side="right") - 1
    local = (spans - doc_first[doc][:, None]).astype(np.int32).reshape(-1)
    return {name: local, f"{name[:3]}_off": 2 * np.searchsorted(doc, np.arange(n_docs + 1))}


def _token_spans(pos: np.ndarray, char_spans: np.ndarray) -> np.ndarray:
    """(n, 2) character spans -> token [start, end): the tokens whose position lies in the span."""
    tok = np.searchsorted(pos, char_spans, side="left")
    return tok[tok[:, 1] > tok[:, 0]]
