"""Normalisation, sentence splitting and the character spans stored per document."""
import itertools
import string

import numpy as np
import pytest

from data_prep import text as T


def test_sentences_cover_the_text_and_respect_abbreviations():
    t = T.normalize("Dr. Smith met Mr. J. Doe at 3.5 p.m. in the U.S. office.  It rained!\n\n\nNew paragraph here", T.TextOptions())
    segs = T.split_sentences(t)
    assert "".join(segs) == t
    assert [s.strip() for s in segs] == [
        "Dr. Smith met Mr. J. Doe at 3.5 p.m. in the U.S. office.", "It rained!", "New paragraph here"]


def test_chinese_sentences_keep_closing_quotes():
    t = "他说：“今天下雨了。”我们回家吧！好的"
    assert T.split_sentences(t) == ["他说：“今天下雨了。”", "我们回家吧！", "好的"]


def test_normalize_nfkc_and_whitespace():
    opts = T.TextOptions()
    assert T.normalize("ｆｕｌｌ\u3000width\tand   spaces\nwrapped\n\n\n\nnext", opts) == "full width and spaces wrapped\n\nnext"
    raw = "keep\t this\n"
    assert T.normalize(raw, T.TextOptions(nfkc=False, whitespace="keep")) == raw.strip()


def test_words():
    t = "Don't split state-of-the-art -- or U.S. 3.5% naïve_x 北京大学好"
    assert T.words(t) == ["Don't", "split", "state-of-the-art", "--", "or", "U", ".", "S", ".", "3", ".", "5", "%",
                          "naïve", "_", "x", "北", "京", "大", "学", "好"]
    from data_prep.chinese import Segmenter

    assert T.words("北京大学好", Segmenter()) == ["北京大学", "好"]
    assert T.words("北京大学好", Segmenter(["北京大学好"])) == ["北京大学好"]  # an added word comes out whole
    assert T.words("") == [] and T.words("  a  ") == ["a"]


def test_phrases_are_runs_of_content_words():
    t = "Natural language processing is fun, and the quick brown fox jumps over lazy dogs.\n\nNew York City"
    got = [t[a:b] for a, b in T.phrase_spans(t, *T.word_spans(t), max_words=4)]
    assert got == ["Natural language processing", "quick brown fox jumps", "lazy dogs", "New York City"]
    got = [t[a:b] for a, b in T.phrase_spans(t, *T.word_spans(t), max_words=2)]
    assert got == ["Natural language", "quick brown", "fox jumps", "lazy dogs", "New York"]


def test_entities_longest_match_on_word_boundaries():
    t = "She moved to New York City, not to York or Yorkshire."
    m = T.EntityMatcher(["New York", "New York City", "York"])
    assert [t[a:b] for a, b in m(t, *T.word_spans(t))] == ["New York City", "York"]
    assert T.EntityMatcher([])(t, *T.word_spans(t)) == []


def regex_sentence_spans(text: str, doc_starts=()) -> list[tuple[int, int]]:
    """The sentence rules as data_prep.text's regular expressions state them, one match at a time (how
    `sentence_spans` found them before it used array operations): the reference it is held to."""
    cuts = {*doc_starts, len(text), *(m.start() for m in T._PARA.finditer(text)),
            *(m.end() for m in T._END_CJK.finditer(text))}
    for m in T._END_LATIN.finditer(text):
        word = T._LAST_WORD.search(text, max(0, m.start() - 24), m.start()).group().lstrip("(\"'“‘").lower()
        nxt = m.group(2)
        if m.group(1) != "." or (word and word not in T._ABBREV and not (len(word) == 1 and word.isalpha())
                                 and (nxt.isupper() or nxt.isdigit() or nxt in "\"'“‘([" or T.CJK_RE.match(nxt))):
            cuts.add(m.end())
    spans, prev = [], 0
    for cut in sorted(cuts):
        if cut <= prev:
            continue
        if text[prev:cut].isspace():
            prev = cut if cut in doc_starts else prev
            continue
        spans.append((prev, cut))
        prev = cut
    if prev < len(text) and spans:
        spans[-1] = (spans[-1][0], len(text))
    return spans


def test_sentence_spans_equal_the_regular_expressions(corpus):
    """On random text full of the rules' edge cases (runs of marks, closers, abbreviations, a period after a
    newline, letters whose lower case is longer or ASCII, characters past the BMP, document starts) and on the
    embedded corpus joined as a build joins a chunk, the compiled loop gives exactly the regexes' spans."""
    import random

    import numpy as np

    rng = random.Random(0)
    alphabet = [*"ab A.B!?。！？…\n\n \t\r\x0b\x1c\u3000\xa0\"')”’」(“‘[]x1Z中文İ\u212a\U00020000\U0001d400",
                "Dr", "mr", "e.g", "etc", "U.S", "approx", "Sept", "fig", ". ", ".\n", "\n."]
    for _ in range(4000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        docs = set(rng.sample(range(1, len(s)), 2)) if len(s) > 2 and rng.random() < 0.3 else set()
        assert [tuple(x) for x in T.sentence_spans(s, docs).tolist()] == regex_sentence_spans(s, docs), (s, docs)
    texts = [T.normalize(t, T.TextOptions()) for t in corpus["en"] + corpus["zh"]]
    chunk, starts = "\n\n".join(texts), set(np.cumsum([len(t) + 2 for t in texts])[:-1].tolist())
    assert [tuple(x) for x in T.sentence_spans(chunk, starts).tolist()] == regex_sentence_spans(chunk, starts)


def reference_words(text: str, segmenter=None) -> list[tuple[int, int]]:
    """Word spans as T.word_spans defines them, one character at a time: runs of one class (letters, digits and
    marks, with ' ’ - between two of them; or punctuation), each CJK character or `segmenter`'s word."""
    import unicodedata

    def cls(ch):
        if ord(ch) > 0xFFFF:
            return T.CJK if ord(ch) >> 16 == 2 else T.PUNCT
        if T.CJK_RE.match(ch):
            return T.CJK
        return T.SPACE if ch.isspace() else T.WORD if unicodedata.category(ch)[0] in "LNM" else T.PUNCT
    c = [cls(ch) for ch in text]
    joined = [T.WORD if 0 < i < len(text) - 1 and ch in "'’-" and c[i - 1] == c[i + 1] == T.WORD else c[i]
              for i, ch in enumerate(text)]
    cuts = set(np.flatnonzero(segmenter.starts(T.code_points(text))).tolist()) if segmenter else set()
    spans, i = [], 0
    while i < len(text):
        j = i + 1
        if joined[i] == T.CJK:
            while segmenter and j < len(text) and joined[j] == T.CJK and j not in cuts:
                j += 1
        elif joined[i] != T.SPACE:
            while j < len(text) and joined[j] == joined[i]:
                j += 1
        if joined[i] != T.SPACE:
            spans.append((i, j))
        i = j
    return spans


def reference_phrases(text: str, spans, max_words: int) -> list[tuple[int, int]]:
    """Phrases as T.phrase_spans defines them: runs of adjacent words of letters only (of the BMP) that are not
    stopwords (ASCII lower-cased), with no newline between them, cut into pieces of `max_words`, one-word pieces
    dropped."""
    lower = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
    content = [all(ch.isalpha() and ord(ch) <= 0xFFFF for ch in text[a:b]) and text[a:b].translate(lower) not in T._STOP
               for a, b in spans]
    runs, run = [], []
    for k, (a, b) in enumerate(spans):
        if content[k] and run and content[k - 1] and "\n" not in text[spans[k - 1][1]:a]:
            run.append((a, b))
        else:
            runs.append(run)
            run = [(a, b)] if content[k] else []
    runs.append(run)
    pieces = [run[i:i + max_words] for run in runs for i in range(0, len(run), max_words)]
    return [(p[0][0], p[-1][1]) for p in pieces if len(p) > 1]


class Given:
    """A segmenter whose word starts are given (a uint8 mask over the code points)."""

    def __init__(self, mask):
        self.mask = mask

    def starts(self, codes):
        return self.mask


class EveryOther:
    """A segmenter that starts a word at every other character."""

    def starts(self, codes):
        mark = np.zeros(len(codes), np.uint8)
        mark[::2] = 1
        return mark


def test_words_phrases_and_token_places_equal_their_definitions(corpus):
    """The compiled loops behind T.word_spans, T.phrase_spans, T.sentence_bodies and T.token_positions give exactly
    what their definitions (above, one character at a time) give, on random text full of edge cases and on the
    corpus."""
    import bisect
    import random

    import numpy as np

    from data_prep.encode import _WS

    assert min(c for c in range(0x10000) if T.CJK_RE.match(chr(c))) == T.FIRST_CJK  # encode's quick test for CJK
    rng = random.Random(1)
    alphabet = [*"ab AZ.-'’_\n\n \t\u3000\xa0,!1中文北京İ\U00020000\U0001d400", "the", "The", "of", "New", "York", "naïve",
                "don't", "state-of-the-art", "北京大学", "\u2581"]
    segmenter = EveryOther()
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(3000)]
    texts.append("\n\n".join(T.normalize(t, T.TextOptions()) for t in corpus["en"][:300] + corpus["zh"][:300]))
    for text in texts:
        for cjk in (None, segmenter):
            starts, ends = T.word_spans(text, cjk)
            spans = list(zip(starts.tolist(), ends.tolist()))
            assert spans == reference_words(text, cjk), (text, cjk)
            for max_words in (2, 4):
                got = [tuple(x) for x in T.phrase_spans(text, starts, ends, max_words).tolist()]
                assert got == reference_phrases(text, spans, max_words), (text, max_words)
        starts = np.array(sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 9)))), np.int64)
        body, paragraph = T.sentence_bodies(T.code_points(text), starts)
        want = [next((i for i in range(a, len(text)) if not text[i].isspace()), len(text)) for a in starts.tolist()]
        assert body.tolist() == want and paragraph.tolist() == ["\n" in text[a:b] for a, b in zip(starts.tolist(), want)]
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, 2 * rng.randint(0, 20))))
        tokens = [(a, b) for a, b in zip(cuts[::2], cuts[1::2])]  # in order, with gaps, some empty
        tok_starts, tok_ends = (np.array([t[i] for t in tokens], dtype=np.int64).reshape(-1) for i in (0, 1))
        pos, first = T.token_positions(T.code_points(text), tok_starts, tok_ends, starts, _WS)
        want = [b - 1 if any(ch not in _WS for ch in text[a:b]) else b for a, b in tokens]
        word = [bisect.bisect_right(starts.tolist(), p) for p in want]
        assert pos.tolist() == want and first.tolist() == [int(k == 0 or word[k] != word[k - 1]) for k in range(len(word))]


def test_chinese_words_are_rjiebas(corpus):
    """data_prep.chinese cuts text exactly as rjieba (jieba-rs, a separate implementation of jieba) cuts it
    without HMM: on the corpus, on random text of dictionary words, ideographs of every range, ASCII runs and
    joiners, kana, spaces and \\r\\n, and with added words (entities, at the same frequency)."""
    import random

    from data_prep.chinese import ENTITY_FREQ, Segmenter, dictionary_path

    rjieba = pytest.importorskip("rjieba", reason="rjieba not installed (the dev extra has it)")
    ours, theirs = Segmenter(), rjieba.Jieba()
    rng = random.Random(0)
    vocab = [line.split()[0] for i, line in enumerate(dictionary_path().open(encoding="utf-8")) if i % 97 == 0]
    alphabet = [*"的一是了人我在有他这中大来上国个到说们为子和你地出道也时年abcXYZ019+#&._%-，。！？ \n\r、“”（）",
                "\u3400", "\u4dbf", "\uf900", "\u9fff", "\U00020000", "\U0002a700", "\U0002f800", "\u3042", "\uac00"]
    texts = ["".join(rng.choice(vocab if rng.random() < 0.5 else alphabet) for _ in range(rng.randint(1, 30)))
             for _ in range(5000)]
    texts += [T.normalize(t, T.TextOptions()) for t in corpus["zh"] + corpus["en"][:50]]
    for text in texts:
        assert ours.words(text) == theirs.cut(text, False), text
    for text in texts[::25]:  # the word spans a build stores (ideographs only cut) as rjieba's cuts give them
        mask = np.zeros(len(text), np.uint8)
        mask[list(itertools.accumulate(map(len, theirs.cut(text, False)), initial=0))[:-1]] = 1
        assert all(np.array_equal(a, b) for a, b in zip(T.word_spans(text, ours), T.word_spans(text, Given(mask))))
    added = ["北京大学生", "研究生命起源", "中文 分词"]  # entities: new words, spaces and all (they add to the total)
    ours = Segmenter(added)
    for w in added:
        theirs.add_word(w, ENTITY_FREQ, None)
    for text in texts[:500] + ["北京大学生前来应聘", "研究生命起源的人", "我们研究生命起源"]:
        assert ours.words(text) == theirs.cut(text, False), text


def test_chinese_dictionary_grows_its_table(tmp_path):
    """A dictionary whose words share few prefixes has about as many trie nodes as characters, twice the first
    guess: the table doubles until they fit, and every word is found (each comes out whole)."""
    import random

    from data_prep.chinese import Segmenter

    rng = random.Random(0)
    chars = [chr(c) for c in range(0x4E00, 0x9FA5)]
    vocab = sorted({"".join(rng.choice(chars) for _ in range(rng.randint(2, 6))) for _ in range(3000)})
    path = tmp_path / "dict.txt"
    path.write_text("".join(f"{w} 1000 n\n" for w in vocab), encoding="utf-8")
    seg = Segmenter(path=path)
    assert all(seg.words(w) == [w] for w in vocab)
