"""Text clean-up and the character-level structure stored with every document.

A document becomes a list of *segments* whose concatenation is the normalised text: each segment is one
sentence with the whitespace before it, so tokenizing segment by segment loses nothing (byte-level BPE
keeps the spaces, sentencepiece and WordPiece drop them as usual). Words, phrases and entities are
character spans; `data_prep.encode` turns them into token positions.
"""
from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

import numpy as np

try:
    from data_prep import _structure
except ImportError as e:  # a source tree used without `pip install -e .`
    raise ImportError("data_prep's compiled text loops (data_prep/_structure.pyx) are not built: run `pip install -e .` "
                      "in the repository (it needs Cython and a C compiler), or scripts/setup.sh") from e

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af"
CJK_RE = re.compile(f"[{_CJK}]")
FIRST_CJK = 0x3040  # no character below it is in _CJK
# A sentence ends at CJK final punctuation (or ! ? before CJK text, as NFKC makes ！？ ASCII), or at Latin
# . ! ? followed by whitespace; closing quotes and brackets stay with the sentence they close.
_END_CJK = re.compile(rf"(?:[。！？…]+|[!?]+(?=[”’」』）)》\"']*[{_CJK}]))[”’」』）)》\"']*")
_END_LATIN = re.compile(r"([.!?]+)[\"'”’)\]]*(?=\s+(\S))")  # groups: the marks, the next character
_PARA = re.compile(r"\n[^\S\n]*\n\s*")
_ABBREV = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e cf al fig figs no nos vol vols p pp ed eds approx dept "
    "est inc ltd co corp jan feb mar apr jun jul aug sep sept oct nov dec u.s u.k a.m p.m".split()
)
_JOINERS = "'’-"
_STOP = frozenset(
    """a an the and or but if then else of at by for with about against between into through during before
    after above below to from up down in out on off over under again further once here there when where why
    how all any both each few more most other some such no nor not only own same so than too very can will
    just don should now is are was were be been being have has had having do does did doing i me my we our
    you your he him his she her it its they them their what which who whom this that these those am would
    could also may might must shall as s t
    的 了 是 在 和 与 及 或 也 都 就 而 着 把 被 让 给 对 从 向 于 以 之 其 这 那 有 个 不 没 很 又 还 并 但 一 我 你 他 她 它
    们 吗 呢 吧 啊""".split()
)


# What a build records besides documents and token ids, each level adding to the one before: sentence starts
# (BERT's sentence pairs), word starts (whole-word and span masking), phrase and entity spans (ERNIE).
STRUCTURES = ("none", "sentences", "words", "full")


def has(structure: str, level: str) -> bool:
    """Whether a build at `structure` records `level` (one of STRUCTURES)."""
    return STRUCTURES.index(structure) >= STRUCTURES.index(level)


@dataclass(frozen=True)
class TextOptions:
    """How raw text is cleaned and which spans are recorded."""

    nfkc: bool = True
    whitespace: str = "collapse"  # collapse | keep
    min_chars: int = 1
    max_chars: int = 0  # 0: no limit
    max_phrase_words: int = 4
    structure: str = "full"  # one of STRUCTURES


def normalize(text: str, opts: TextOptions) -> str:
    """NFKC (optional); `collapse` turns every whitespace run into one space, except that paragraphs
    (separated by blank lines) stay separated by one blank line."""
    if opts.nfkc:
        text = unicodedata.normalize("NFKC", text)
    if opts.whitespace == "collapse":
        paragraphs = (" ".join(p.split()) for p in _PARA.split(text))
        text = "\n\n".join(p for p in paragraphs if p)
    return text.strip()


def code_points(text: str) -> np.ndarray:
    """The text's code points (uint32), one per character, as the vectorised functions here take them."""
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def has_cjk(text: str) -> bool:
    return CJK_RE.search(text) is not None


_LAST_WORD = re.compile(r"[^\s.!?]*$")


# Flags of a character for the sentence rules, from Python's own str methods (tables for the BMP, built once)
# (data_prep._structure's loops read them; _LETTER: lower-cases to one letter; _SEP: ends _LAST_WORD (\s . ! ?))
from data_prep._structure import (F_BANG as _BANG, F_CJK_CHAR as _CJK_CHAR, F_CJK_CLOSE as _CJK_CLOSE,  # noqa: E402
                                  F_CJK_MARK as _CJK_MARK, F_DIGIT as _DIGIT, F_LATIN_CLOSE as _LATIN_CLOSE,
                                  F_LATIN_MARK as _LATIN_MARK, F_LETTER as _LETTER, F_LSTRIP as _LSTRIP,
                                  F_OPENS as _OPENS, F_SEP as _SEP, F_SPACE as _SPACE, F_UPPER as _UPPER)
_MEMBERS = {_CJK_MARK: "。！？…", _BANG: "!?", _CJK_CLOSE: "”’」』）)》\"'", _LATIN_MARK: ".!?", _LATIN_CLOSE: "\"'”’)]",
            _OPENS: "\"'“‘([", _LSTRIP: "(\"'“‘", _SEP: ".!?"}
_ABBREV_HASHES = np.unique([functools.reduce(lambda h, c: h * 128 + ord(c), a, 0) for a in _ABBREV if "." not in a]
                           ).astype(np.uint64)  # 7 bits a character, at most 9 characters (_structure.pyx)


def _char_flags(chars: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per character: its flags, and the code of its lower case where that is one ASCII character (else 0)."""
    n, codes = len(chars), np.fromiter(map(ord, chars), dtype=np.int64, count=len(chars))
    lowers = list(map(str.lower, chars))

    def where(test, items=chars) -> np.ndarray:
        return np.fromiter(map(test, items), dtype=bool, count=n)
    f = np.zeros(n, dtype=np.uint16)
    f[where(str.isspace)] |= _SPACE | _SEP
    f[where(str.isupper)] |= _UPPER
    f[where(str.isdigit)] |= _DIGIT
    f[where(lambda lw: len(lw) == 1 and lw.isalpha(), lowers)] |= _LETTER
    f[where(lambda ch: CJK_RE.match(ch) is not None)] |= _CJK_CHAR
    for flag, members in _MEMBERS.items():
        f[np.isin(codes, [ord(c) for c in members])] |= flag
    lower = np.fromiter((ord(lw) if len(lw) == 1 and lw.isascii() else 0 for lw in lowers), dtype=np.uint8, count=n)
    return f, lower


@functools.cache
def _flag_tables() -> tuple[np.ndarray, np.ndarray]:
    return _char_flags([chr(c) for c in range(0x10000)])


def sentence_spans(text: str, doc_starts=(), codes: np.ndarray | None = None) -> np.ndarray:
    """(n, 2) [start, end) of each sentence; whitespace before a sentence belongs to it, so the spans cover the
    text. `doc_starts`: positions where a new document begins in a joined text; the whitespace just before one
    separates documents and is left out. `codes`: the text's code points, when the caller has them.

    A sentence ends where _PARA, _END_CJK or _END_LATIN (with its rule for periods) say, found by one compiled
    loop over the characters' flags (data_prep/_structure.pyx; tests/test_text.py holds it to the regular
    expressions)."""
    if codes is None:
        codes = code_points(text)
    astral, flags, lower = np.zeros(0, np.int64), np.zeros(0, np.uint16), np.zeros(0, np.uint8)
    if len(codes) and codes.max() > 0xFFFF:  # past the BMP: no table
        astral = np.flatnonzero(codes > 0xFFFF)
        flags, lower = _char_flags([chr(c) for c in codes[astral].tolist()])
    doc = np.zeros(len(codes) + 1, dtype=np.uint8)
    doc[np.fromiter(doc_starts, dtype=np.int64)] = 1
    return _structure.sentence_spans(codes, *_flag_tables(), astral, flags, lower, doc, _ABBREV_HASHES)


def split_sentences(text: str) -> list[str]:
    """Split normalised text into sentences (leading whitespace kept) whose concatenation is `text`."""
    return [text[a:b] for a, b in sentence_spans(text).tolist()]


SPACE, WORD, CJK, PUNCT = 0, 1, 2, 3
_TABLES: tuple[np.ndarray, np.ndarray] | None = None


def _tables() -> tuple[np.ndarray, np.ndarray]:
    """Per code point of the BMP: its class (SPACE, WORD = letters/digits/marks, CJK, PUNCT) and isalpha."""
    global _TABLES
    if _TABLES is None:
        chars = [chr(c) for c in range(0x10000)]
        cls = np.full(0x10000, PUNCT, dtype=np.uint8)
        cls[[unicodedata.category(ch)[0] in "LNM" for ch in chars]] = WORD
        cls[np.fromiter(map(str.isspace, chars), dtype=bool, count=0x10000)] = SPACE
        cls[[bool(CJK_RE.match(ch)) for ch in chars]] = CJK
        _TABLES = cls, np.fromiter(map(str.isalpha, chars), dtype=bool, count=0x10000)
    return _TABLES


@functools.cache
def _char_table(chars: str) -> np.ndarray:
    """Which BMP code points are among `chars` (a table the compiled loops index)."""
    table = np.zeros(0x10000, dtype=bool)
    table[[ord(c) for c in chars]] = True
    table[0xFFFF] = False  # stands for every code point past the BMP
    return table


def word_spans(text: str, segmenter=None, codes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Word [start, end) character offsets: runs of letters/digits (apostrophes and hyphens inside a word
    join it), runs of punctuation, and CJK words cut where `segmenter.starts(codes)` (a uint8 mask over the code
    points, as data_prep.chinese.Segmenter gives) marks a word start; each CJK character a word without one.
    `codes`: the text's code points, when the caller has them."""
    if codes is None:
        codes = code_points(text)
    cut = segmenter.starts(codes) if segmenter is not None else None
    return _structure.word_spans(codes, _tables()[0], _char_table(_JOINERS).view(np.uint8), cut)


def words(text: str, segmenter=None) -> list[str]:
    starts, ends = word_spans(text, segmenter)
    return [text[a:b] for a, b in zip(starts.tolist(), ends.tolist())]


_STOP_HASHES: np.ndarray | None = None


def _stop_hashes() -> np.ndarray:
    global _STOP_HASHES
    if _STOP_HASHES is None:
        joined = " ".join(_STOP)
        starts, ends = word_spans(joined)
        _STOP_HASHES = np.unique(_structure.span_hashes(code_points(joined), starts, ends))
    return _STOP_HASHES


def phrase_spans(text: str, starts: np.ndarray, ends: np.ndarray, max_words: int,
                 codes: np.ndarray | None = None) -> np.ndarray:
    """(n, 2) character spans of multi-word phrases: maximal runs of adjacent content words (all letters,
    not a stopword), cut into pieces of at most `max_words`; punctuation and paragraph breaks end runs."""
    if codes is None:
        codes = code_points(text)
    return _structure.phrase_spans(codes, _tables()[1].view(np.uint8), starts, ends, _stop_hashes(), max_words)


def sentence_bodies(codes: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For sentences of a text (code points `codes`) starting at `starts`: where each one's first non-space
    character is, and whether a newline comes before it (it opens a paragraph)."""
    return _structure.sentence_bodies(codes, _tables()[0], np.ascontiguousarray(starts))


def token_positions(codes: np.ndarray, starts: np.ndarray, ends: np.ndarray, wstarts: np.ndarray,
                    blank: str) -> tuple[np.ndarray, np.ndarray]:
    """For tokens at character [starts, ends) of a text with code points `codes` and words starting at
    `wstarts`: each token's position, its last character (for a token of only `blank` characters, such as
    sentencepiece's lone "▁", the character after it, so that it joins the word that follows), and whether
    it opens a word (uint8: its position lies in another word than the previous token's)."""
    return _structure.token_words(codes, _char_table(blank).view(np.uint8), starts, ends, wstarts)


class EntityMatcher:
    """Longest match of dictionary entities over word sequences (entities are matched whole words only)."""

    def __init__(self, entities: list[str], segmenter=None):
        self.table: set[tuple[str, ...]] = set()
        self.longest = 0
        for ent in entities:
            key = tuple(words(ent, segmenter))
            if key:
                self.table.add(key)
                self.longest = max(self.longest, len(key))

    def __call__(self, text: str, starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
        """Character spans of the entities found in the words [starts, ends) of `text`."""
        if not self.table:
            return []
        toks = [text[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
        out, i = [], 0
        while i < len(toks):
            for n in range(min(self.longest, len(toks) - i), 0, -1):
                if tuple(toks[i : i + n]) in self.table:
                    out.append((int(starts[i]), int(ends[i + n - 1])))
                    i += n
                    break
            else:
                i += 1
        return out
