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

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af"
CJK_RE = re.compile(f"[{_CJK}]")
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


def _paragraph_starts(codes: np.ndarray, nonspace: np.ndarray) -> np.ndarray:
    """Where `_PARA.finditer` matches start, vectorised: the first newline of each whitespace run that holds
    two newlines or more. `nonspace`: how many non-whitespace characters precede each position."""
    newlines = np.flatnonzero(codes == 10)
    if len(newlines) < 2:
        return newlines[:0]
    run = nonspace[newlines]  # equal for the newlines of one whitespace run
    same = run[1:] == run[:-1]
    first = np.concatenate([[True], ~same]) & np.concatenate([same, [False]])
    return newlines[first]


# Flags of a character for the sentence rules, from Python's own str methods (tables for the BMP, built once)
(_SPACE, _CJK_CHAR, _UPPER, _DIGIT, _CJK_MARK, _BANG, _CJK_CLOSE, _LATIN_MARK, _LATIN_CLOSE, _OPENS, _LSTRIP, _SEP,
 _LETTER) = (1 << i for i in range(13))  # _LETTER: lower-cases to one letter; _SEP: ends _LAST_WORD (\s . ! ?)
_MEMBERS = {_CJK_MARK: "。！？…", _BANG: "!?", _CJK_CLOSE: "”’」』）)》\"'", _LATIN_MARK: ".!?", _LATIN_CLOSE: "\"'”’)]",
            _OPENS: "\"'“‘([", _LSTRIP: "(\"'“‘", _SEP: ".!?"}
_MAX_ABBREV = 9  # an abbreviation (without dots: _LAST_WORD has none) is at most this long; 7 bits a character
_ABBREV_HASHES = np.unique([functools.reduce(lambda h, c: h * 128 + ord(c), a, 0) for a in _ABBREV if "." not in a])


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


def _sentence_flags(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position of the text: (flags, ASCII lower case or 0)."""
    flags, lower = _flag_tables()
    bmp = np.minimum(codes, 0xFFFF)
    f, low = flags[bmp], lower[bmp]
    beyond = np.flatnonzero(codes > 0xFFFF)
    if len(beyond):
        f[beyond], low[beyond] = _char_flags([chr(c) for c in codes[beyond].tolist()])
    return f, low


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[start, end) of each run of True."""
    edges = np.diff(np.concatenate([[0], mask.view(np.int8), [0]]))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def _past(f: np.ndarray, at: np.ndarray, flag: int) -> np.ndarray:
    """The first position >= each of `at` whose character lacks `flag` (len(f) where none does)."""
    outside = np.flatnonzero((f & flag) == 0)
    i = np.searchsorted(outside, at)
    return np.where(i < len(outside), outside[np.minimum(i, len(outside) - 1)] if len(outside) else 0, len(f))


def _cjk_ends(f: np.ndarray) -> np.ndarray:
    """The ends of _END_CJK's matches: each run of 。！？… with the closing quotes and brackets after it, and each
    run of ASCII ! ? whose closers are followed by a CJK character."""
    marks = _past(f, _runs((f & _CJK_MARK) != 0)[1], _CJK_CLOSE)
    bangs = _past(f, _runs((f & _BANG) != 0)[1], _CJK_CLOSE)
    before_cjk = (bangs < len(f)) & ((f[np.minimum(bangs, len(f) - 1)] & _CJK_CHAR) != 0)
    return np.concatenate([marks, bangs[before_cjk]])


def _latin_ends(codes: np.ndarray, f: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """The ends of _END_LATIN's matches (a run of . ! ?, closers, then whitespace and a character) that end a
    sentence: all but a lone period after an abbreviation, a single letter or a number (no word: `3.5`), or before
    a word that starts in lower case."""
    n = len(f)
    first, after = _runs((f & _LATIN_MARK) != 0)
    end = _past(f, after, _LATIN_CLOSE)
    following = _past(f, end, _SPACE)  # the next word's first character
    match = (end < n) & ((f[np.minimum(end, n - 1)] & _SPACE) != 0) & (following < n)
    first, after, end, following = first[match], after[match], end[match], following[match]
    period = (after - first == 1) & (codes[first] == 46)
    ends = np.ones(len(first), dtype=bool)
    ends[period] = _ends_sentence(codes, f, lower, first[period], following[period])
    return end[ends]


def _ends_sentence(codes, f, lower, at: np.ndarray, following: np.ndarray) -> np.ndarray:
    """For lone periods at `at`: _LAST_WORD's search over the 24 characters before it ($ also matches before a
    final newline), stripped of opening quotes and lower-cased, is a word, not an abbreviation nor one letter,
    and the next word (at `following`) opens with an upper-case letter, a digit, a quote or bracket, or CJK."""
    n = len(f)
    lo = np.maximum(at - 24, 0)
    stop = np.where((at - 1 >= lo) & (codes[np.maximum(at - 1, 0)] == 10), at - 1, at)
    separators = np.flatnonzero((f & _SEP) != 0)
    last = np.searchsorted(separators, stop) - 1  # the last separator before stop
    start = np.maximum(lo, np.where(last >= 0, separators[np.maximum(last, 0)] + 1 if len(separators) else 0, 0))
    while (strip := (start < stop) & ((f[np.minimum(start, n - 1)] & _LSTRIP) != 0)).any():
        start += strip
    length = stop - start
    hashes, ascii_word = np.zeros(len(at), dtype=np.int64), length <= _MAX_ABBREV
    for k in range(_MAX_ABBREV):
        inside = k < length
        c = lower[np.minimum(start + k, n - 1)].astype(np.int64)
        ascii_word &= ~inside | (c != 0)
        hashes = np.where(inside, hashes * 128 + c, hashes)
    abbreviation = ascii_word & np.isin(hashes, _ABBREV_HASHES)
    letter = (length == 1) & ((f[np.minimum(start, n - 1)] & _LETTER) != 0)
    opens = (f[following] & (_UPPER | _DIGIT | _OPENS | _CJK_CHAR)) != 0
    return (length > 0) & ~abbreviation & ~letter & opens


def sentence_spans(text: str, doc_starts=(), codes: np.ndarray | None = None) -> np.ndarray:
    """(n, 2) [start, end) of each sentence; whitespace before a sentence belongs to it, so the spans cover the
    text. `doc_starts`: positions where a new document begins in a joined text; the whitespace just before one
    separates documents and is left out. `codes`: the text's code points, when the caller has them.

    A sentence ends where _PARA, _END_CJK or _END_LATIN (with its rule for periods) say, found with array
    operations over the characters' flags (tests/test_text.py holds them to the regular expressions)."""
    if codes is None:
        codes = code_points(text)
    n = len(codes)
    if not n:
        return np.zeros((0, 2), dtype=np.int64)
    f, lower = _sentence_flags(codes)
    doc = np.zeros(n + 1, dtype=bool)
    doc[np.fromiter(doc_starts, dtype=np.int64)] = True
    nonspace = np.concatenate([[0], np.cumsum((f & _SPACE) == 0)])
    cut = doc.copy()
    for ends in (_paragraph_starts(codes, nonspace), _cjk_ends(f), _latin_ends(codes, f, lower), [n]):
        cut[ends] = True
    cuts = np.flatnonzero(cut[1:]) + 1
    # a piece between two cuts that is only whitespace joins the next sentence, or is dropped before a document
    solid = nonspace[cuts] > nonspace[np.concatenate([[0], cuts[:-1]])]
    moves = solid | doc[cuts]  # the cuts where the next sentence's start moves
    latest = np.maximum.accumulate(np.where(moves, np.arange(len(cuts)), -1))
    before = np.concatenate([[-1], latest[:-1]])
    starts = np.where(before >= 0, cuts[np.maximum(before, 0)], 0)
    spans = np.stack([starts[solid], cuts[solid]], axis=1)
    if len(spans) and (latest[-1] < 0 or cuts[latest[-1]] < n):
        spans[-1, 1] = n  # trailing whitespace stays with the last sentence
    return spans


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
    table = np.zeros(0x10000, dtype=bool)
    table[[ord(c) for c in chars]] = True
    table[0xFFFF] = False  # stands for every code point past the BMP
    return table


def among(codes: np.ndarray, chars: str) -> np.ndarray:
    """Which code points (uint32) are among the BMP characters `chars`: a table lookup (np.isin sorts)."""
    return _char_table(chars)[np.minimum(codes, 0xFFFF)]


def spaces(codes: np.ndarray) -> np.ndarray:
    """Which code points are whitespace (str.isspace)."""
    return _classes(codes) == SPACE


def _classes(codes: np.ndarray) -> np.ndarray:
    cls = _tables()[0][np.minimum(codes, 0xFFFF)]
    cls[codes > 0xFFFF] = np.where((codes[codes > 0xFFFF] >> 16) == 2, CJK, PUNCT)  # plane 2: CJK extensions
    return cls


_B = 0x100000001B3  # odd, so invertible modulo 2**64
_B_INVERSE = pow(_B, -1, 1 << 64)


_POWERS: dict[int, np.ndarray] = {}


def _powers(base: int, n: int) -> np.ndarray:
    """base**0 .. base**(n-1) modulo 2**64 (kept, and grown by doubling, per base: every chunk needs them)."""
    out = _POWERS.get(base)
    if out is None or len(out) < n:
        out = np.ones(max(n, 2 * len(out) if out is not None else 1), dtype=np.uint64)
        out[1:] = np.cumprod(np.full(len(out) - 1, base, dtype=np.uint64))
        _POWERS[base] = out
    return out[:max(n, 1)]


def _span_hashes(codes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """A polynomial hash (mod 2**64) of each span's characters, ASCII lower-cased: equal words, equal hashes."""
    c = codes.astype(np.uint64)
    c[(c >= 65) & (c <= 90)] += np.uint64(32)
    powers, inverse = _powers(_B, len(c)), _powers(_B_INVERSE, len(c))
    prefix = np.concatenate([np.zeros(1, np.uint64), np.cumsum(c * powers, dtype=np.uint64)])
    return (prefix[ends] - prefix[starts]) * inverse[starts]


def word_spans(text: str, cjk_words=None, codes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Word [start, end) character offsets: runs of letters/digits (apostrophes and hyphens inside a word
    join it), runs of punctuation, and CJK words from `cjk_words` (each CJK character without it). `codes`:
    the text's code points, when the caller has them."""
    if codes is None:
        codes = code_points(text)
    cls = _classes(codes)
    if len(cls) > 2:  # don't, o'clock, state-of-the-art
        joiner = among(codes[1:-1], _JOINERS) & (cls[:-2] == WORD) & (cls[2:] == WORD)
        cls[1:-1][joiner] = WORD
    prev = np.concatenate([[SPACE], cls[:-1]])
    start = (cls != SPACE) & ((cls != prev) | (cls == CJK))
    in_cjk = cls == CJK
    if cjk_words is not None and in_cjk.any():
        # one segmenter call for the whole text (it splits off non-CJK parts itself); a CJK word
        # starts at each boundary inside a CJK run and at the start of every run
        lengths = np.fromiter(map(len, cjk_words(text)), dtype=np.int64)
        cuts = np.cumsum(lengths) - lengths
        start[in_cjk] = False
        start[cuts[in_cjk[cuts]]] = True
        start[in_cjk & (prev != CJK)] = True
    starts = np.flatnonzero(start)
    # a word ends where the next one starts or at the first space after it
    space_after = np.flatnonzero(cls == SPACE)
    next_space = space_after[np.minimum(np.searchsorted(space_after, starts), max(len(space_after) - 1, 0))] \
        if len(space_after) else np.full(len(starts), len(text))
    next_space = np.where(next_space > starts, next_space, len(text))
    next_start = np.append(starts[1:], len(text))
    return starts, np.minimum(next_space, next_start)


def words(text: str, cjk_words=None) -> list[str]:
    starts, ends = word_spans(text, cjk_words)
    return [text[a:b] for a, b in zip(starts.tolist(), ends.tolist())]


_STOP_HASHES: np.ndarray | None = None


def _stop_hashes() -> np.ndarray:
    global _STOP_HASHES
    if _STOP_HASHES is None:
        joined = " ".join(_STOP)
        starts, ends = word_spans(joined)
        _STOP_HASHES = np.unique(_span_hashes(code_points(joined), starts, ends))
    return _STOP_HASHES


def phrase_spans(text: str, starts: np.ndarray, ends: np.ndarray, max_words: int,
                 codes: np.ndarray | None = None) -> np.ndarray:
    """(n, 2) character spans of multi-word phrases: maximal runs of adjacent content words (all letters,
    not a stopword), cut into pieces of at most `max_words`; punctuation and paragraph breaks end runs."""
    if len(starts) < 2:
        return np.zeros((0, 2), np.int64)
    if codes is None:
        codes = code_points(text)
    not_alpha = np.concatenate([[0], np.cumsum(~_tables()[1][np.minimum(codes, 0xFFFF)])])
    hashes, stop = _span_hashes(codes, starts, ends), _stop_hashes()
    is_stop = stop[np.minimum(np.searchsorted(stop, hashes), len(stop) - 1)] == hashes  # stop is sorted
    content = (not_alpha[ends] == not_alpha[starts]) & ~is_stop
    newlines = np.concatenate([[0], np.cumsum(codes == 10)])
    gap_break = np.ones(len(starts), dtype=bool)
    gap_break[1:] = newlines[starts[1:]] > newlines[ends[:-1]]
    prev_content = np.concatenate([[False], content[:-1]])
    run = np.cumsum(content & (gap_break | ~prev_content))  # run number of each content word
    idx = np.flatnonzero(content)
    if not len(idx):
        return np.zeros((0, 2), np.int64)
    rid = run[idx]  # non-decreasing: a word's place in its run counts from the run's first word
    first = np.flatnonzero(np.diff(rid, prepend=-1))
    position = np.arange(len(idx)) - np.repeat(first, np.diff(np.append(first, len(idx))))
    group = rid * (len(starts) + 1) + position // max_words
    bounds = np.flatnonzero(np.diff(group)) + 1
    first, last = np.concatenate([[0], bounds]), np.concatenate([bounds, [len(idx)]]) - 1
    keep = last > first
    return np.stack([starts[idx[first[keep]]], ends[idx[last[keep]]]], axis=1)


class EntityMatcher:
    """Longest match of dictionary entities over word sequences (entities are matched whole words only)."""

    def __init__(self, entities: list[str], cjk_words=None):
        self.table: set[tuple[str, ...]] = set()
        self.longest = 0
        for ent in entities:
            key = tuple(words(ent, cjk_words))
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
