"""Text clean-up and the character-level structure stored with every document.

A document becomes a list of *segments* whose concatenation is the normalised text: each segment is one
sentence with the whitespace before it, so tokenizing segment by segment loses nothing (byte-level BPE
keeps the spaces, sentencepiece and WordPiece drop them as usual). Words, phrases and entities are
character spans; `data_prep.encode` turns them into token positions.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af"
CJK_RE = re.compile(f"[{_CJK}]")
# A sentence ends at CJK final punctuation (or ! ? before CJK text, as NFKC makes ！？ ASCII), or at Latin
# . ! ? followed by whitespace; closing quotes and brackets stay with the sentence they close.
_END_CJK = re.compile(rf"(?:[。！？…]+|[!?]+(?=[”’」』）)》\"']*[{_CJK}]))[”’」』）)》\"']*")
_END_LATIN = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s)")
_PARA = re.compile(r"\n[^\S\n]*\n\s*")
_ABBREV = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e cf al fig figs no nos vol vols p pp ed eds approx dept "
    "est inc ltd co corp jan feb mar apr jun jul aug sep sept oct nov dec u.s u.k a.m p.m".split()
)
# Words (Latin runs, apostrophes and hyphens inside), single CJK characters, single other symbols.
_WORD = re.compile(rf"[^\W_{_CJK}]+(?:['’\-][^\W_{_CJK}]+)*|[{_CJK}]|[^\w\s]+|_+")
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


@dataclass(frozen=True)
class TextOptions:
    """How raw text is cleaned and which spans are recorded."""

    nfkc: bool = True
    whitespace: str = "collapse"  # collapse | keep
    min_chars: int = 1
    max_chars: int = 0  # 0: no limit
    max_phrase_words: int = 4


def normalize(text: str, opts: TextOptions) -> str:
    """NFKC (optional); `collapse` turns every whitespace run into one space, except that paragraphs
    (separated by blank lines) stay separated by one blank line."""
    if opts.nfkc:
        text = unicodedata.normalize("NFKC", text)
    if opts.whitespace == "collapse":
        paragraphs = (" ".join(p.split()) for p in _PARA.split(text))
        text = "\n\n".join(p for p in paragraphs if p)
    return text.strip()


def has_cjk(text: str) -> bool:
    return CJK_RE.search(text) is not None


def _latin_end_ok(text: str, start: int, end: int) -> bool:
    """A period ends a sentence unless it closes an abbreviation, an initial or a number."""
    if text[start] != ".":
        return True
    word = text[:start].rsplit(None, 1)[-1] if text[:start].strip() else ""
    word = word.lstrip("(\"'“‘").lower()
    if not word or word in _ABBREV or (len(word) == 1 and word.isalpha()):
        return False
    nxt = text[end:].lstrip()[:1]
    return bool(nxt) and (nxt.isupper() or nxt.isdigit() or nxt in "\"'“‘([" or bool(CJK_RE.match(nxt)))


def split_sentences(text: str) -> list[str]:
    """Split normalised text into segments (leading whitespace kept) whose concatenation is `text`."""
    cuts = {m.end() for m in _PARA.finditer(text)}
    for m in _PARA.finditer(text):
        cuts.add(m.start())
    cuts.update(m.end() for m in _END_CJK.finditer(text))
    cuts.update(m.end() for m in _END_LATIN.finditer(text) if _latin_end_ok(text, m.start(), m.end()))
    segments, prev = [], 0
    for cut in sorted(cuts):
        if cut <= prev or not text[prev:cut].strip():
            continue
        segments.append(text[prev:cut])
        prev = cut
    tail = text[prev:]
    if tail.strip():
        segments.append(tail)
    elif segments:
        segments[-1] += tail
    return segments


def words(text: str, cjk_words=None) -> list[tuple[int, int]]:
    """Character spans of words. CJK runs are segmented by `cjk_words` (jieba) when given."""
    spans = []
    pos = 0
    for m in _WORD.finditer(text):
        s, e = m.span()
        if cjk_words is not None and CJK_RE.match(text, s):
            continue  # handled below, run by run
        spans.append((s, e))
    if cjk_words is not None:
        for run in re.finditer(f"[{_CJK}]+", text):
            pos = run.start()
            for w in cjk_words(run.group()):
                spans.append((pos, pos + len(w)))
                pos += len(w)
        spans.sort()
    return spans


def phrases(text: str, word_spans: list[tuple[int, int]], max_words: int) -> list[tuple[int, int]]:
    """Multi-word chunks: maximal runs of 2..max_words adjacent content words (letters, not stopwords).
    Punctuation is a word of its own, so it ends a run, as does a paragraph break."""
    out, run = [], []
    for s, e in word_spans + [(len(text), len(text))]:
        w = text[s:e]
        if w.isalpha() and w.lower() not in _STOP and not (run and "\n" in text[run[-1][1] : s]):
            run.append((s, e))
            continue
        for i in range(0, len(run) - 1, max_words):
            piece = run[i : i + max_words]
            if len(piece) >= 2:
                out.append((piece[0][0], piece[-1][1]))
        run = [(s, e)] if w.isalpha() and w.lower() not in _STOP else []
    return out


class EntityMatcher:
    """Longest match of dictionary entities over word sequences (entities are matched whole words only)."""

    def __init__(self, entities: list[str], cjk_words=None):
        self.table: set[tuple[str, ...]] = set()
        self.longest = 0
        for ent in entities:
            key = tuple(ent[s:e] for s, e in words(ent, cjk_words))
            if key:
                self.table.add(key)
                self.longest = max(self.longest, len(key))

    def __call__(self, text: str, word_spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
        if not self.table:
            return []
        toks = [text[s:e] for s, e in word_spans]
        out, i = [], 0
        while i < len(toks):
            for n in range(min(self.longest, len(toks) - i), 0, -1):
                if tuple(toks[i : i + n]) in self.table:
                    out.append((word_spans[i][0], word_spans[i + n - 1][1]))
                    i += n
                    break
            else:
                i += 1
        return out
