"""BERT / ERNIE samples over a real dataset, checked against the corpus: layout, NSP/SOP, FULL-SENTENCES,
masking statistics, whole-word, span and knowledge masking, determinism."""
import shutil

import numpy as np
import pytest

from data_prep.dataset import Corpus
from helpers import quick_build
from pretrain.data.bert import BertDataset, _truncate_pair
from pretrain.data.masking import IGNORE, Masker, SimilarWords

ENTITIES = "Python\nmodule\nobject\nfile\nstring\n李白\n杜甫\n长安\n"


@pytest.fixture(scope="module")
def dataset(small, sp_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("bert")
    (d / "entities.txt").write_text(ENTITIES, encoding="utf-8")
    quick_build([small["path"]], d / "ds", tokenizer=sp_model, entities=str(d / "entities.txt"))
    return str(d / "ds")


@pytest.fixture(scope="module")
def located(dataset):
    return Located(Corpus(dataset))


class Located:
    """The corpus as one token stream, documents separated by -1, to find where a segment came from."""

    def __init__(self, corpus: Corpus):
        self.corpus = corpus
        docs = [corpus.tokens(d).astype(np.int32) for d in range(len(corpus))]
        self.first = np.cumsum([0] + [len(t) + 1 for t in docs[:-1]])
        self.stream = np.concatenate([np.r_[t, -1] for t in docs]).astype(np.int32)
        self.bytes = self.stream.tobytes()
        self.boundary = np.zeros(len(self.stream) + 1, dtype=bool)  # sentence starts and document ends
        for d in range(len(corpus)):
            self.boundary[self.first[d] + corpus.sentence_starts(d)] = True
            self.boundary[self.first[d] + len(docs[d])] = True

    def find(self, tokens) -> np.ndarray:
        """Every stream position where `tokens` occur."""
        needle, found, i = np.asarray(tokens, dtype=np.int32).tobytes(), [], -1
        while (i := self.bytes.find(needle, i + 1)) >= 0:
            if i % 4 == 0:
                found.append(i // 4)
        return np.array(found, dtype=np.int64)

    def doc(self, pos):
        return np.searchsorted(self.first, pos, side="right") - 1

    def whole_sentences(self, tokens) -> np.ndarray:
        """Positions where `tokens` occur as whole sentences (from a sentence start to a sentence end)."""
        at = self.find(tokens)
        return at[self.boundary[at] & self.boundary[at + len(tokens)]]


def make(dataset, seq_len=128, pair_task="nsp", seed=11, **masking):
    c = Corpus(dataset)
    return BertDataset(dataset, seq_len, Masker(c.special_ids, c.vocab_size, **masking), pair_task=pair_task, seed=seed)


def original(s):
    return np.where(s["labels"] != IGNORE, s["labels"], s["input_ids"])


def segments(s):
    """(A, B) token arrays and their sequence positions of a [CLS] A [SEP] B [SEP] sample."""
    n = int(s["attention_mask"].sum())
    a_sep = int(np.flatnonzero(s["token_type_ids"][:n] == 0)[-1])
    ids = original(s)
    return (ids[1:a_sep], 1), (ids[a_sep + 1:n - 1], a_sep + 1)


def test_layout(dataset):
    ds = make(dataset)
    sp = ds.corpus.special_ids
    for i in range(200):
        s = ds.sample(0, i)
        assert set(s) == {"input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label"}
        assert all(v.dtype == np.int64 for v in s.values()) and s["next_sentence_label"].shape == ()
        assert all(s[k].shape == (128,) for k in ("input_ids", "token_type_ids", "attention_mask", "labels"))
        n = int(s["attention_mask"].sum())
        assert np.array_equal(s["attention_mask"], np.arange(128) < n) and n <= 128
        ids, types = original(s), s["token_type_ids"]
        (a, a_at), (b, b_at) = segments(s)
        assert len(a) and len(b) and len(a) + len(b) == n - 3
        assert ids[0] == sp["cls"] and ids[a_at + len(a)] == ids[n - 1] == sp["sep"] and (ids[n:] == sp["pad"]).all()
        assert (types[:b_at] == 0).all() and (types[b_at:n] == 1).all() and (types[n:] == 0).all()


def test_truncation_equals_berts_truncate_seq_pair():
    g = np.random.default_rng(0)
    for la in range(1, 25):
        for lb in range(1, 25):
            for max_tokens in range(2, 50):
                a, b = la, lb
                while a + b > max_tokens:  # truncate_seq_pair: one token off the longer, ties B
                    a, b = (a - 1, b) if a > b else (a, b - 1)
                (_, a0, a1), (_, b0, b1) = _truncate_pair(g, (0, 10, 10 + la), (1, 50, 50 + lb), max_tokens)
                assert (a1 - a0, b1 - b0) == (a, b) and 10 <= a0 and a1 <= 10 + la and 50 <= b0 and b1 <= 50 + lb
    fronts = [_truncate_pair(g, (0, 0, 100), (1, 0, 10), 50)[0][1] for _ in range(2000)]
    assert abs(np.mean(fronts) - 30) < 1  # 60 tokens off A, each from the front with probability 1/2


@pytest.mark.parametrize("seq_len", [128, 512])
def test_nsp_pairs_are_consecutive_sentences_or_another_document(dataset, located, seq_len):
    ds = make(dataset, seq_len)
    labels, strong = [], 0
    for i in range(150):
        s = ds.sample(0, i)
        (a, _), (b, _) = segments(s)
        label = int(s["next_sentence_label"])
        labels.append(label)
        if len(a) + len(b) < ds.max_tokens:  # not truncated: A is whole sentences, then B
            strong += 1
            if label == 0:
                at = located.whole_sentences(np.r_[a, b])
                assert located.boundary[at + len(a)].any(), f"sample {i}: B does not follow A at a sentence start"
            else:
                da, db = located.doc(located.whole_sentences(a)), located.doc(located.whole_sentences(b))
                assert len(da) and len(db) and (set(da) | set(db)) != {da[0]}, f"sample {i}: B not from another doc"
        elif label == 0:  # truncated: A then B in one document, a sentence start between them
            pa, pb = located.find(a), located.find(b)
            assert any(located.doc(x) == located.doc(y) and x + len(a) <= y and located.boundary[x + len(a):y + 1].any()
                       for x in pa for y in pb[pb >= x]), f"sample {i}"
    assert 0.35 < np.mean(labels) < 0.75
    assert strong > (100 if seq_len == 512 else 5)


def test_sop_swaps_consecutive_segments(dataset, located):
    ds = make(dataset, 512, pair_task="sop")
    labels = []
    for i in range(150):
        s = ds.sample(0, i)
        (a, _), (b, _) = segments(s)
        label = int(s["next_sentence_label"])
        labels.append(label)
        if len(a) + len(b) < ds.max_tokens:
            first, second = (a, b) if label == 0 else (b, a)
            at = located.find(np.r_[first, second])
            assert len(at) and located.boundary[at].any(), f"sample {i}: segments are not consecutive in order"
    assert 0.4 < np.mean(labels) < 0.6
    from pretrain import objectives

    for name, task in (("mlm_sop", "sop"), ("mlm_nsp", "nsp")):  # ALBERT's logs sop_acc, not nsp_acc
        objective = objectives.get(name)
        assert set(objective.select(s)) == {"mlm", task} and objective.headline[-1] == f"{task}_acc"


def test_full_sentences_pack_whole_sentences_across_documents(dataset, located):
    ds = make(dataset, 128, pair_task="none")
    sep = ds.corpus.special_ids["sep"]
    crossed = 0
    for i in range(200):
        s = ds.sample(0, i)
        assert "next_sentence_label" not in s and not s["token_type_ids"].any()
        n = int(s["attention_mask"].sum())
        ids = original(s)[1:n - 1]
        pieces = np.split(ids, np.flatnonzero(ids == sep))
        pieces = [pieces[0]] + [p[1:] for p in pieces[1:]]
        crossed += len(pieces) > 1
        docs = []
        for k, p in enumerate(pieces):
            at = located.find(p)
            ok = located.boundary[at] & (located.boundary[at + len(p)] | (n == ds.seq_len))  # long sentences are cut
            if k < len(pieces) - 1:  # a document's last sentences, then the next document's first ones
                ok &= located.stream[at + len(p)] == -1
            if k > 0:
                ok &= located.stream[at - 1] == -1
            assert ok.any(), f"sample {i} piece {k}"
            docs.append(set(located.doc(at[ok]).tolist()))
        assert all(any(d + 1 in docs[k + 1] for d in docs[k]) for k in range(len(docs) - 1))
    assert crossed > 10


def test_masking_statistics(dataset):
    ds = make(dataset, 128, mask_prob=0.15)
    sp = ds.corpus.special_ids
    samples = [ds.sample(0, i) for i in range(1500)]
    ids, labels = np.stack([s["input_ids"] for s in samples]), np.stack([s["labels"] for s in samples])
    orig = np.where(labels != IGNORE, labels, ids)
    special = np.isin(orig, [sp["cls"], sp["sep"], sp["pad"]])
    masked = labels != IGNORE
    assert not (masked & special).any() and np.array_equal(ids[special], orig[special])
    assert abs(masked.sum() / (~special).sum() - 0.15) < 0.01
    as_mask = (ids[masked] == sp["mask"]).mean()
    kept = (ids[masked] == labels[masked]).mean()
    random = masked & (ids != sp["mask"]) & (ids != labels)
    assert abs(as_mask - 0.8) < 0.02 and abs(kept - 0.1) < 0.015 and abs(random.sum() / masked.sum() - 0.1) < 0.015
    assert not np.isin(ids[random], list(sp.values())).any()
    assert not (masked & (orig == ids) & (ids == sp["mask"])).any()

    capped = make(dataset, 128, max_predictions=8)
    counts = np.array([(capped.sample(0, i)["labels"] != IGNORE).sum() for i in range(300)])
    assert counts.max() == 8 and (counts == 8).mean() > 0.9


def masked_runs(ds, located, index, unit_starts):
    """For each segment of sample `index` found once in the corpus: (mask flags, unit ids) of its tokens,
    units from `unit_starts(doc, start, end)` (True where a unit starts)."""
    s = ds.sample(0, index)
    out = []
    for tokens, at in segments(s):
        where = located.find(tokens)
        if len(where) != 1 or not len(tokens):
            continue
        doc = int(located.doc(where[0]))
        start = int(where[0] - located.first[doc])
        starts = unit_starts(doc, start, start + len(tokens))
        starts[0] = True
        out.append((s["labels"][at:at + len(tokens)] != IGNORE, np.cumsum(starts)))
    return out


def split_units(runs) -> int:
    """How many units are partly masked."""
    return sum(len(np.intersect1d(unit[masked], unit[~masked])) for masked, unit in runs)


def words_of(located):
    return lambda doc, lo, hi: located.corpus.word_start(doc)[lo:hi].astype(bool)


def test_whole_word_masking_masks_whole_words(dataset, located):
    wwm, tokens = make(dataset, strategy="whole_word"), make(dataset, strategy="token")
    runs = [r for i in range(150) for r in masked_runs(wwm, located, i, words_of(located))]
    assert sum(m.sum() for m, _ in runs) > 500
    assert split_units(runs) == 0
    assert split_units([r for i in range(150) for r in masked_runs(tokens, located, i, words_of(located))]) > 20


def test_span_masking_masks_runs_of_whole_words(dataset, located):
    span = make(dataset, strategy="span")
    runs = [r for i in range(150) for r in masked_runs(span, located, i, words_of(located))]
    assert split_units(runs) == 0
    lengths = []  # masked runs, in words
    for masked, unit in runs:
        edges = np.flatnonzero(np.diff(np.r_[0, masked.astype(int), 0]))
        lengths += [len(np.unique(unit[a:b])) for a, b in zip(edges[::2], edges[1::2])]
    assert np.mean(lengths) > 2.5  # geometric(0.2) clipped at 10 has mean 3.6 words; whole words ~1


def test_ngram_masking_masks_1_to_3_whole_words_with_albert_probabilities(dataset, located):
    """ALBERT's n-grams: units of n = 1, 2, 3 whole words with probabilities 6/11, 3/11, 2/11; masking never splits
    a word."""
    runs = [r for i in range(150) for r in masked_runs(make(dataset, strategy="ngram"), located, i, words_of(located))]
    assert split_units(runs) == 0 and sum(m.sum() for m, _ in runs) > 500
    c = Corpus(dataset)
    masker, rng = Masker(c.special_ids, c.vocab_size, strategy="ngram"), np.random.default_rng(0)
    word_start = rng.random(30000) < 0.6
    word_start[0] = True
    starts = masker._unit_starts(rng, np.ones(30000, dtype=bool), word_start, ())
    words_per_unit = np.bincount(np.cumsum(starts)[word_start])[1:]
    assert set(words_per_unit.tolist()) == {1, 2, 3}
    share = np.bincount(words_per_unit, minlength=4)[1:] / len(words_per_unit)
    np.testing.assert_allclose(share, [6 / 11, 3 / 11, 2 / 11], atol=0.015)


def test_correction_masking_puts_similar_words_where_masks_were(dataset, tmp_path):
    """MacBERT: no [MASK] ever; a chosen word with similar words of as many tokens becomes one of them 80% of the
    time, stays 10% (counted on one-token words); the similar-words file is read in the dataset's tokens."""
    c = Corpus(dataset)
    tok = c.tokenizer()
    words = sorted({p[1:] for p in map(tok.piece, range(c.vocab_size)) if p.startswith("\u2581") and p[1:].isalpha()
                    and len(p) > 3})
    (tmp_path / "similar.txt").write_text("".join(f"{w} {words[(i + 1) % len(words)]}\n" for i, w in enumerate(words)))
    similar = SimilarWords(str(tmp_path / "similar.txt"), tok)
    assert len(similar) >= len(words)  # every word, as one "▁word" token
    data = make(dataset, strategy="correction", similar=similar)
    outcomes = []
    for i in range(300):
        s = data.sample(0, i)
        assert c.special_ids["mask"] not in s["input_ids"]
        for at in np.flatnonzero(s["labels"] != IGNORE):
            key = (int(s["labels"][at]),)
            after = int(original(s)[at + 1])
            if key in similar.table and (tok.piece(after).startswith("\u2581") or after in c.special_ids.values()):
                now = int(s["input_ids"][at])
                outcomes.append("similar" if any(now == x[0] for x in similar.table[key]) else
                                "kept" if now == key[0] else "random")
    share = {k: outcomes.count(k) / len(outcomes) for k in ("similar", "kept", "random")}
    assert len(outcomes) > 300
    assert abs(share["similar"] - 0.8) < 0.06 and abs(share["kept"] - 0.1) < 0.05, share


def test_correction_masking_says_what_replaces_the_chosen_words(dataset, tmp_path, capsys):
    """MacBERT without a similar-words file (or with one whose words the tokenizer spells otherwise) replaces every
    chosen word by a random word: the run says so once, as it says how many words a usable file gives."""
    from pretrain import objectives
    from pretrain.config import load
    from pretrain.objectives.masked_lm import _say_similar

    _say_similar.cache_clear()
    (tmp_path / "similar.txt").write_text("module package\n")
    found = len(SimilarWords(str(tmp_path / "similar.txt"), Corpus(dataset).tokenizer()))
    assert found
    for similar, said in (("", "data.similar_words is not set; every chosen word becomes a random word"),
                          (tmp_path / "similar.txt", f"similar words for {found} words")):
        cfg = load("macbert-tiny", [f"data.path={dataset}", f"data.similar_words={similar}"])
        objectives.get(cfg.data.objective).configured(cfg).masker(Corpus(dataset))
        assert said in capsys.readouterr().err


@pytest.mark.parametrize("level,kinds", [("entity", ("phrase", "entity")), ("phrase", ("phrase",))])
def test_knowledge_masking_masks_whole_phrases_and_entities(dataset, located, level, kinds):
    ds = make(dataset, strategy="knowledge", knowledge_level=level)

    def spans(doc, lo, hi):
        starts = np.zeros(hi - lo + 1, dtype=bool)
        starts[:-1] = located.corpus.word_start(doc)[lo:hi]
        for kind in kinds:
            inside = [(a - lo, b - lo) for a, b in getattr(located.corpus, f"{kind}_spans")(doc) if lo <= a and b <= hi]
            for a, b in inside:
                starts[[a, b]] = True
            for a, b in inside:
                starts[a + 1:b] = False
        return starts[:hi - lo]

    runs = [r for i in range(200) for r in masked_runs(ds, located, i, spans)]
    assert split_units(runs) == 0
    assert sum(len(np.unique(u[m])) < m.sum() for m, u in runs) > 30  # multi-token units were masked
    masked = np.mean([(ds.sample(0, i)["labels"] != IGNORE).sum() for i in range(200)])
    assert 10 < masked < 20


def test_same_samples_from_independent_builders(dataset, tmp_path):
    keys = [(0, 0), (0, 3), (2, 7), (5, 123)]
    copy = shutil.copytree(dataset, tmp_path / "copy", ignore=shutil.ignore_patterns(".ptm_index"))
    for kw in ({"strategy": "whole_word"}, {"strategy": "knowledge"}, {"pair_task": "none", "strategy": "span"}):
        a = [make(dataset, **kw).sample(*k) for k in keys]
        b = [make(str(copy), **kw).sample(*k) for k in keys]
        for x, y in zip(a, b):
            assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
    ds = make(dataset)
    assert sum(np.array_equal(ds.sample(0, i)["input_ids"], ds.sample(1, i)["input_ids"]) for i in range(50)) < 3
    other = make(dataset, seed=12)
    assert sum(np.array_equal(ds.sample(0, i)["input_ids"], other.sample(0, i)["input_ids"]) for i in range(50)) < 3
