"""GPT-2 windows over a real dataset: the token stream exactly, determinism, the index cache, the split."""
import os
import pickle
import shutil

import numpy as np
import pytest

import pretrain.data.gpt as gpt
from data_prep.dataset import Corpus
from helpers import quick_build
from pretrain.data.gpt import GPTDataset
from pretrain.data.indexes import split_documents

SEQ = 64
WINDOWS = gpt.windows  # the real builder, wrapped by a counting one below


@pytest.fixture(scope="module")
def dataset(small, sp_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpt") / "ds"
    quick_build([small["path"]], out, tokenizer=sp_model)
    return str(out)


def stream(corpus, docs):
    eod = corpus.special_ids["eod"]
    return np.concatenate([np.r_[corpus.tokens(int(d)), eod] for d in docs]).astype(np.int64)


def test_unpacked_windows_hold_each_document_once_padded_at_its_end(dataset):
    """pack=False: every document (and its end-of-document token) is predicted exactly once, in windows that never
    cross into another document; padding carries labels -100, so samples predict different numbers of tokens."""
    corpus = Corpus(dataset)
    ds = GPTDataset(dataset, SEQ, seed=7, pack=False)
    pad, eod = corpus.special_ids["pad"], corpus.special_ids["eod"]
    lengths = corpus.doc_lengths()
    assert len(ds) == int((-(-lengths // SEQ)).sum())
    predicted = {}
    e = ds.epoch_index(0)
    assert sorted(e.shuffle.tolist()) == list(range(len(ds)))
    for i in range(len(ds)):
        s = ds.sample(0, i)
        pos, offset = (int(x) for x in e.windows[e.shuffle[i]])
        doc = np.r_[corpus.tokens(int(ds.docs[pos])), eod]
        n = int((s["labels"] != -100).sum())
        assert np.array_equal(s["labels"][:n], doc[offset + 1:offset + 1 + n])
        assert np.array_equal(s["input_ids"][:n], doc[offset:offset + n])
        assert (s["labels"][n:] == -100).all() and (s["input_ids"][n + 1:] == pad).all()
        predicted.setdefault(pos, []).append((offset, n))
    for pos, parts in predicted.items():  # the windows of a document tile it: every token after the first once
        assert sum(n for _, n in parts) == lengths[ds.docs[pos]]
    counts = [int((ds.sample(0, i)["labels"] != -100).sum()) for i in range(50)]
    assert len(set(counts)) > 1


def test_windows_reproduce_the_concatenated_token_stream(dataset):
    corpus = Corpus(dataset)
    ds = GPTDataset(dataset, SEQ, seed=7)
    total = int(corpus.doc_lengths().sum()) + len(corpus)
    assert len(ds) == (total - 1) // SEQ
    orders = []
    for epoch in (0, 1):
        e = ds.epoch_index(epoch)
        docs = ds.docs[e.order]
        assert sorted(docs.tolist()) == list(range(len(corpus)))
        tokens = stream(corpus, docs)
        assert sorted(e.shuffle.tolist()) == list(range(len(ds)))
        by_window = {}
        for i in range(len(ds)):
            s = ds.sample(epoch, i)
            assert s["input_ids"].dtype == np.int64 and s["input_ids"].shape == s["labels"].shape == (SEQ,)
            assert np.array_equal(s["input_ids"][1:], s["labels"][:-1])
            by_window[int(e.shuffle[i])] = np.r_[s["input_ids"], s["labels"][-1]]
        rebuilt = np.concatenate([by_window[w][:-1] for w in range(len(ds))] + [by_window[len(ds) - 1][-1:]])
        assert np.array_equal(rebuilt, tokens[:len(ds) * SEQ + 1])
        orders.append(docs)
    assert not np.array_equal(*orders)  # documents are reshuffled every epoch


def test_independent_builders_give_identical_samples(dataset, tmp_path):
    keys = [(0, 0), (0, 17), (1, 5), (3, 100)]
    first = [GPTDataset(dataset, SEQ, seed=7).sample(*k) for k in keys]
    copy = shutil.copytree(dataset, tmp_path / "copy", ignore=shutil.ignore_patterns(".ptm_index"))
    again = [GPTDataset(str(copy), SEQ, seed=7).sample(*k) for k in keys]  # indexes built afresh
    other_seed = [GPTDataset(dataset, SEQ, seed=8).sample(*k) for k in keys]
    for a, b, c in zip(first, again, other_seed):
        assert np.array_equal(a["input_ids"], b["input_ids"]) and np.array_equal(a["labels"], b["labels"])
    assert any(not np.array_equal(a["input_ids"], c["input_ids"]) for a, c in zip(first, other_seed))


def test_index_cache_is_reused_and_rebuilt_when_parameters_change(dataset, monkeypatch):
    index_dir = os.path.join(dataset, ".ptm_index")
    shutil.rmtree(index_dir, ignore_errors=True)
    calls = []
    monkeypatch.setattr(gpt, "windows", lambda *a: calls.append(a) or WINDOWS(*a))
    expected = GPTDataset(dataset, SEQ, seed=7).sample(2, 3)
    files = {f: os.path.getmtime(os.path.join(index_dir, f)) for f in os.listdir(index_dir)}
    assert len(calls) == 1 and len(files) == 3 and all(f.endswith(".npy") for f in files)  # order, windows, shuffle
    again = GPTDataset(dataset, SEQ, seed=7)
    assert np.array_equal(again.sample(2, 3)["input_ids"], expected["input_ids"])
    assert isinstance(again.epoch_index(2).windows.base, np.memmap)
    assert len(calls) == 1 and {f: os.path.getmtime(os.path.join(index_dir, f)) for f in files} == files
    GPTDataset(dataset, SEQ // 2, seed=7).sample(2, 3)
    assert len(calls) == 2 and len(os.listdir(index_dir)) == 5  # new windows and shuffle; same order



def test_split_sources_hold_only_their_documents(dataset):
    corpus = Corpus(dataset)
    train, valid = split_documents(len(corpus), 0.2, seed=7)
    assert len(valid) > 50
    for docs in (train, valid):
        ds = GPTDataset(dataset, SEQ, seed=7, docs=docs)
        assert np.array_equal(np.sort(ds.docs[ds.epoch_index(0).order]), docs)
        tokens = stream(corpus, ds.docs[ds.epoch_index(0).order])
        w = int(ds.epoch_index(0).shuffle[0])
        assert np.array_equal(ds.sample(0, 0)["input_ids"], tokens[w * SEQ:(w + 1) * SEQ])


def test_pickles_without_its_memory_maps(dataset):
    ds = GPTDataset(dataset, SEQ, seed=7)
    expected = ds.sample(1, 9)
    data = pickle.dumps(ds)
    assert len(data) < 20_000
    assert np.array_equal(pickle.loads(data).sample(1, 9)["input_ids"], expected["input_ids"])


def test_gpt2s_own_vocabulary_pads_with_its_end_token_and_other_samples_name_what_it_lacks(small, gpt2_vocab,
                                                                                            tmp_path):
    """GPT-2's vocabulary has <|endoftext|> alone: its unpacked windows are padded with it (labels -100, never
    attended to by a real token); samples that need more special pieces refuse it in one line naming each (BERT's and
ERNIE's: their masker)."""
    from pretrain.data.bart import DenoisingDataset
    from pretrain.data.masking import Masker
    from pretrain.data.permutation import PermutationSamples
    from pretrain.data.t5 import SpanCorruption

    out = str(tmp_path / "ds")
    quick_build([small["path"]], out, tokenizer=gpt2_vocab)
    corpus = Corpus(out)
    assert corpus.special_ids.get("pad") is None and corpus.special_ids["eod"] is not None
    ds = GPTDataset(out, SEQ, seed=7, pack=False)
    padded = next(s for s in (ds.sample(0, i) for i in range(len(ds))) if s["labels"][-1] == -100)
    n = int((padded["labels"] != -100).sum())
    assert (padded["input_ids"][n:] == corpus.special_ids["eod"]).all()
    needs = {lambda: PermutationSamples(out, SEQ, 10, 10): "sep ([SEP], <sep>, </s>) or cls ([CLS], <cls>, <s>), "
                                                           "needed for XLNet's",
             lambda: SpanCorruption(out, SEQ, [1, 2]): "pad ([PAD], <pad>), needed for T5's",
             lambda: DenoisingDataset(out, SEQ): "cls ([CLS], <cls>, <s>), pad ([PAD], <pad>) or mask ([MASK], "
                                                 "<mask>), needed for denoising",
             lambda: Masker(corpus.special_ids, corpus.vocab_size, where=out): "needed for token masking"}
    for make, missing in needs.items():
        with pytest.raises(ValueError) as e:
            make()
        line = str(e.value)
        assert line.startswith(f"{out}: its tokenizer has no piece for ") and missing in line and "\n" not in line
