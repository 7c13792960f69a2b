"""BART's denoising samples (pretrain/data/bart.py) against their definition: Poisson span lengths covering 30% of the
tokens, one mask per span (an insertion for a length 0), sentence permutation, and the target the original run."""
from collections import Counter

import numpy as np
import pytest

from pretrain.data import bart


def test_span_lengths_are_poisson_draws_covering_thirty_percent():
    """Their sum is round(0.3 n) exactly; untrimmed, they are Poisson(3): mean 3, P(0) = e^-3."""
    g = np.random.default_rng(0)
    drawn = []
    for n in (10, 64, 500):
        for _ in range(200):
            lengths = bart.span_lengths(n, g)
            assert lengths.sum() == round(0.3 * n) and (lengths >= 0).all()
            drawn += lengths[:-1].tolist()  # the last one is trimmed
    drawn = np.array(drawn)
    assert abs(drawn.mean() - 3) < 0.1 and abs((drawn == 0).mean() - np.exp(-3)) < 0.01


def test_infilling_puts_one_mask_per_span_and_keeps_the_rest_in_order():
    g = np.random.default_rng(1)
    mask = -1
    for _ in range(300):
        tokens = g.integers(10, 1000, int(g.integers(5, 200)))
        state = g.bit_generator.state
        lengths = bart.span_lengths(len(tokens), g)
        g.bit_generator.state = state  # infill draws the same lengths first
        out = bart.infill(tokens, g, mask)
        spans = int((lengths > 0).sum())
        assert (out == mask).sum() == min(spans, len(tokens)) + int((lengths == 0).sum())
        kept = out[out != mask]
        assert len(tokens) - len(kept) <= lengths.sum()  # spans may overlap: fewer tokens hidden, never more
        it = iter(tokens.tolist())
        assert all(t in it for t in kept.tolist())  # a subsequence: order kept
        assert 0 < len(tokens) - len(kept) or lengths.sum() == 0


@pytest.fixture(scope="module")
def source(train_data):
    return bart.DenoisingDataset(train_data, 64, seed=3)


def test_samples_rebuild_the_original_run_from_permuted_infilled_sentences(source):
    """The target is <s> + the run's sentences in order + </s>; the input <s> + the same sentences permuted and
    infilled + </s>; the decoder's input is the target shifted right after </s>; padding to seq_len; a sample
    depends on its index alone."""
    from data_prep.dataset import Corpus

    special = Corpus(source.path).special_ids
    permuted = 0
    for i in range(40):
        s = source.sample(0, i)
        target = s["labels"][s["labels"] != -100]
        inputs = s["input_ids"][s["attention_mask"].astype(bool)]
        assert target[0] == inputs[0] == special["cls"] and target[-1] == inputs[-1] == special["eod"]
        assert (s["decoder_input_ids"][:len(target)] == np.concatenate([[special["eod"]], target[:-1]])).all()
        assert (s["decoder_attention_mask"].sum() == len(target)) and len(s["input_ids"]) == 64
        kept = Counter(inputs[1:-1][inputs[1:-1] != special["mask"]].tolist())
        assert not kept - Counter(target[1:-1].tolist())  # every kept token comes from the original
        assert (inputs == special["mask"]).any()
        lo, hi, _ = source.chunks[source.epoch_index(0)[i]]
        if hi - lo > 1:
            it = iter(target[1:-1].tolist())
            permuted += not all(t in it for t in inputs[1:-1][inputs[1:-1] != special["mask"]].tolist())
    assert permuted > 5  # sentences moved: the kept tokens are out of the original order
    again = source.sample(0, 7)
    assert all((again[k] == source.sample(0, 7)[k]).all() for k in again)


def test_mass_masks_half_of_each_sentence_and_feeds_the_decoder_its_shifted_fragment(train_data):
    """MASS: in each sentence one contiguous fragment of round(len / 2) tokens is the mask token in the encoder's
    input and the labels there; the decoder reads the fragment shifted right (the sentence's previous token or <s>
    first) and the mask token elsewhere; encoder and decoder positions align."""
    from data_prep.dataset import Corpus
    from pretrain.data.mass import MassDataset

    special = Corpus(train_data).special_ids
    source = MassDataset(train_data, 64, seed=5)
    for i in range(30):
        s = source.sample(0, i)
        pieces = source.sentences_of(0, i)
        tokens = np.concatenate(pieces)
        n = len(tokens)
        assert s["attention_mask"].sum() == s["decoder_attention_mask"].sum() == n + 2
        enc, dec, labels = s["input_ids"][1:n + 1], s["decoder_input_ids"][1:n + 1], s["labels"][1:n + 1]
        at = 0
        for piece in pieces:
            span = np.flatnonzero(labels[at:at + len(piece)] != -100)
            k = max(1, round(len(piece) / 2))
            assert len(span) == k and (np.diff(span) == 1).all()  # one contiguous fragment of half the sentence
            u = at + span[0]
            assert (labels[u:u + k] == tokens[u:u + k]).all() and (enc[u:u + k] == special["mask"]).all()
            assert dec[u] == (tokens[u - 1] if u > at else special["cls"]) and (dec[u + 1:u + k] == tokens[u:u + k - 1]).all()
            at += len(piece)
        assert ((enc == tokens) | (labels != -100)).all() and ((dec == special["mask"]) | (labels != -100)).all()
