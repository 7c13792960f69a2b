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


def test_sentence_end_search_equals_the_regexes_it_speeds_up():
    """`sentence_spans` tries its regexes only at candidate characters and finds paragraph breaks with numpy;
    on random text both give exactly what `re.finditer` gives."""
    import random

    import numpy as np

    rng = random.Random(0)
    alphabet = list("ab A.B!?。！？…\n\n \t\r\x0b\x1c\u3000\xa0\"')”’」(x1Z中文")
    for _ in range(3000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        codes = np.frombuffer(s.encode("utf-32-le"), dtype=np.uint32)
        assert T._paragraph_starts(codes).tolist() == [m.start() for m in T._PARA.finditer(s)], repr(s)
        for pattern, first in ((T._END_CJK, "。！？…!?"), (T._END_LATIN, ".!?")):
            assert [m.span() for m in T._matches(pattern, s, codes, first)] == \
                [m.span() for m in pattern.finditer(s)], repr(s)
