"""Normalisation, sentence splitting and the character spans stored per document."""
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
    assert T.words("北京大学好", lambda s: ["北京大学", "好"]) == ["北京大学", "好"]
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


def test_sentence_spans_equal_the_regular_expressions_they_vectorise(corpus):
    """On random text full of the rules' edge cases (runs of marks, closers, abbreviations, a period after a
    newline, letters whose lower case is longer or ASCII, characters past the BMP, document starts) and on the
    embedded corpus joined as a build joins a chunk, the array version gives exactly the regexes' spans."""
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
