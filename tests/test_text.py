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
