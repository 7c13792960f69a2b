"""T5's span corruption (pretrain/data/t5.py) against its definition: the published lengths, the noise mask's counts
and runs, span lengths drawn as uniformly random splits, and inputs and targets that rebuild the sample."""
import itertools
from collections import Counter

import numpy as np
import pytest

from pretrain.data import t5


def test_lengths_are_t5s_and_fill_the_input_exactly():
    """512 inputs take 568 raw tokens and 114 targets (T5's random_spans_helper at density 0.15, mean span 3); every
    input length has a raw length whose corrupted input fills it exactly."""
    assert t5.lengths(512) == (568, 114)
    for seq_len in (16, 33, 64, 128, 200, 1024):
        raw, targets = t5.lengths(seq_len)
        noise, spans = t5.counts(raw)
        assert raw - noise + spans + 1 == seq_len and noise + spans + 1 == targets
        assert raw + 1 - t5.counts(raw + 1)[0] + t5.counts(raw + 1)[1] + 1 > seq_len  # the longest raw length


def test_noise_mask_counts_runs_and_starts_with_kept_tokens():
    g = np.random.default_rng(0)
    for length in (10, 57, 568):
        noise, spans = t5.counts(length)
        for _ in range(50):
            m = t5.noise_mask(length, g)
            assert m.shape == (length,) and m.sum() == noise and not m[0] and m[-1]
            starts = m & ~np.concatenate([[False], m[:-1]])
            assert starts.sum() == spans  # noise spans, each after a run of kept tokens


def test_span_lengths_are_uniformly_random_splits():
    """Splitting 6 into 3 positive parts: each of the C(5, 2) = 10 splits about equally often."""
    g = np.random.default_rng(1)
    n = 20000
    seen = Counter(tuple(t5._split(6, 3, g)) for _ in range(n))
    every = {c for c in itertools.product(range(1, 5), repeat=3) if sum(c) == 6}
    assert set(seen) == every and len(every) == 10
    sigma = (n * 0.1 * 0.9) ** 0.5
    assert all(abs(k - n / 10) < 5 * sigma for k in seen.values()), seen


def test_inputs_and_targets_rebuild_the_sample():
    """Each sentinel of the input, replaced by the tokens after the same sentinel in the target, gives the sample
    back; sentinels count up from <extra_id_0>, each used once on each side."""
    g = np.random.default_rng(2)
    sentinels = np.arange(1000, 900, -1)  # <extra_id_k> = 1000 - k, as T5 counts down from the vocabulary's end
    eos = 1
    for seq_len in (64, 128):
        raw, target_len = t5.lengths(seq_len)
        for _ in range(20):
            tokens = g.integers(2, 800, raw)
            inputs, targets = t5.corrupt(tokens, t5.noise_mask(raw, g), sentinels, eos)
            assert len(inputs) == seq_len and len(targets) == target_len and inputs[-1] == targets[-1] == eos
            spans, current = {}, None
            for t in targets[:-1]:
                if t in sentinels:
                    current = spans.setdefault(int(t), [])
                else:
                    current.append(int(t))
            rebuilt = [tok for t in inputs[:-1] for tok in (spans[int(t)] if t in sentinels else [int(t)])]
            assert rebuilt == tokens.tolist()
            used = [int(t) for t in inputs if t in sentinels]
            assert used == sentinels[:len(used)].tolist() == [int(t) for t in targets if t in sentinels]


def test_too_few_sentinels_is_an_error_naming_the_fix():
    g = np.random.default_rng(3)
    raw, _ = t5.lengths(128)
    with pytest.raises(ValueError, match="noise spans but 2 sentinels; give the tokenizer more sentinels"):
        t5.corrupt(np.arange(raw), t5.noise_mask(raw, g), np.array([9, 8]), 1)


def test_samples_are_windows_of_the_document_stream_corrupted_by_their_own_draws(train_data):
    """SpanCorruption: inputs of seq_len, targets of the helper's length, the decoder's input the target shifted right
    after the padding id; a sample depends on its index alone (asked in any order, the same), and the windows cover
    the document stream without overlapping (every sample rebuilt from its input and target is the next piece)."""
    from pretrain.data.gpt import GPTDataset

    sentinels = np.arange(10 ** 6, 10 ** 6 - 100, -1)  # stand-ins: ids beyond the vocabulary
    source = t5.SpanCorruption(train_data, 64, sentinels, seed=5)
    raw, target_len = t5.lengths(64)
    stream = GPTDataset(train_data, raw, seed=5)
    first = [source.sample(0, i) for i in range(6)]
    assert all(s["input_ids"].shape == (64,) and s["labels"].shape == (target_len,) for s in first)
    assert all((s["decoder_input_ids"] == np.concatenate([[source.pad], s["labels"][:-1]])).all() for s in first)
    again = [source.sample(0, i) for i in reversed(range(6))][::-1]
    assert all((a[k] == b[k]).all() for a, b in zip(first, again) for k in a)
    for i, s in enumerate(first):
        spans, current = {}, None
        for t in s["labels"][:-1]:
            if t in sentinels:
                current = spans.setdefault(int(t), [])
            else:
                current.append(int(t))
        rebuilt = [tok for t in s["input_ids"][:-1] for tok in (spans[int(t)] if t in sentinels else [int(t)])]
        assert rebuilt == stream.sample(0, i)["input_ids"].tolist()
    assert not (first[0]["input_ids"] == source.sample(1, 0)["input_ids"]).all()  # another epoch, other draws


def test_every_sample_predicts_as_many_tokens_however_short_the_documents(train_data):
    """SpanCorruption's invariant, which makes T5's per-micro-batch loss mean its global-batch mean: every sample of an
    epoch, over documents mostly shorter than a window, has seq_len inputs and the objective's `predicted_tokens`
    labels, none ignored."""
    from types import SimpleNamespace

    from data_prep.dataset import Corpus
    from pretrain.objectives import get

    source = t5.SpanCorruption(train_data, 256, np.arange(10 ** 6, 10 ** 6 - 100, -1), seed=5)
    assert np.median(Corpus(train_data).doc_lengths()) < source.raw  # most windows hold several documents
    predicted = get("span_corruption").predicted_tokens(SimpleNamespace(seq_len=256))
    for i in range(len(source)):
        s = source.sample(0, i)
        assert (len(s["input_ids"]), len(s["labels"]), int((s["labels"] != -100).sum())) == (256, predicted,
                                                                                           predicted), i


def test_sentinels_follow_the_vocabulary_and_no_text_encodes_to_them(t5_data, sp_model):
    """--sentinels 100: the vocabulary grows by 100 ids, <extra_id_0> the last as in T5's vocabularies, the
    tokenizer names them, the dataset lists them, and no document's tokens reach them."""
    from data_prep.dataset import Corpus
    from data_prep.tokenizer import load_tokenizer

    base = load_tokenizer(sp_model).vocab_size
    corpus, tok = Corpus(t5_data), load_tokenizer(t5_data)
    assert corpus.vocab_size == tok.vocab_size == base + 100
    assert corpus.sentinel_ids == tok.sentinel_ids() == list(range(base + 99, base - 1, -1))
    assert [tok.piece(i) for i in corpus.sentinel_ids[:2]] == ["<extra_id_0>", "<extra_id_1>"]
    assert max(int(corpus.tokens(i).max()) for i in range(len(corpus))) < base


def test_span_accuracy_counts_span_tokens_with_the_markers_left_out_of_the_guess(t5_data):
    """Held-out `lm_span_acc`: on the span tokens only (sentinel and end targets left out of the count) the model's
    guess is its best token other than the markers, so a sentinel scored highest does not cost the span token scored
    next; `lm_span_unigram_acc` counts the most frequent token on the same tokens."""
    import torch

    from data_prep.dataset import Corpus
    from pretrain.config import load
    from pretrain.losses import Term
    from pretrain.objectives import get
    from pretrain.parallel import mcore

    mcore.initialize(1, 0)
    corpus = Corpus(t5_data)
    objective = get("span_corruption").configured(load("t5-tiny", [f"data.path={t5_data}"]))
    sentinel, eos, word, other = corpus.sentinel_ids[0], corpus.special_ids["eod"], 7, 9
    target = torch.tensor([sentinel, word, word, other, eos])
    logits = torch.zeros(5, corpus.vocab_size)
    logits[:, sentinel] = 5.0  # the markers' columns lead everywhere
    logits[[1, 3], [word, other]] = 2.0  # right on two of the three span tokens
    logits[2, other] = 2.0
    hits, count = objective.held_out(logits, target)["lm_span_acc"]
    assert (int(hits), int(count)) == (2, 3)
    labels = torch.tensor([[sentinel, word, word, other, eos, -100]])
    terms = {"lm": Term(torch.zeros(()), torch.tensor(5))}
    hits, count = objective.baselines({"labels": labels}, terms, most_frequent=word)["lm_span_unigram_acc"]
    assert (int(hits), int(count)) == (2, 3)


def test_sentinels_added_to_a_finished_dataset_equal_a_build_with_them(train_data, t5_data, tmp_path):
    """`data_prep sentinels`: the same shards, the tokenizer of `data_prep build --sentinels 100` (its metadata and
    sentinel ids), a dataset `data_prep verify` accepts; a dataset that has them already is refused."""
    import json

    from data_prep import PrepError
    from data_prep.dataset import Corpus
    from data_prep.sentinels import add_sentinels
    from data_prep.verify import verify

    out = str(tmp_path / "t5")
    add_sentinels(train_data, out)
    assert verify(out) == []
    made, built = Corpus(out), Corpus(t5_data)
    assert made.sentinel_ids == built.sentinel_ids and len(made.sentinel_ids) == 100
    assert made.manifest["tokenizer"] == {**built.manifest["tokenizer"], "path": made.manifest["tokenizer"]["path"]}
    assert (made.tokens(3) == Corpus(train_data).tokens(3)).all()
    with open(f"{train_data}/manifest.json") as f:
        assert not json.load(f)["tokenizer"].get("sentinels")  # the source is untouched
    with pytest.raises(PrepError, match="already has 100 sentinels"):
        add_sentinels(out, str(tmp_path / "again"))
    from pretrain import objectives
    from pretrain.config import load

    t5_objective = objectives.get("span_corruption").configured(load("t5-tiny", [f"data.path={train_data}"]))
    with pytest.raises(ValueError, match=f"add them without rebuilding: `python -m data_prep sentinels {train_data} "):
        t5_objective.source(train_data, Corpus(train_data), None, None)  # (a dataset without: the command that adds)
