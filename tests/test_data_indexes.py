"""Index builders against straightforward loops, the .npy cache, the split, blending, and a 100M-token scale."""

import numpy as np
import pytest

from helpers import wikipedia_like_shapes
from pretrain.data.indexes import (IndexCache, Stream, blend, chain, packed_chunks, pair_chunks, quotas,
                                   sentence_table, shuffle, split_documents, windows)


def synthetic_table(seed, num_docs=300, max_sentences=8, max_len=60):
    """A sentence_table over random documents: (table, sentence lengths per document)."""
    g = np.random.default_rng(seed)
    docs = [g.integers(1, max_len, g.integers(1, max_sentences + 1)) for _ in range(num_docs)]
    counts = np.array([len(d) for d in docs])
    offsets = np.concatenate([[0], np.cumsum(counts)])
    starts = np.concatenate([np.concatenate([[0], np.cumsum(d)[:-1]]) for d in docs]).astype(np.int32)
    lengths = np.array([d.sum() for d in docs])
    return sentence_table(offsets, starts, lengths, np.arange(num_docs)), docs


def test_sentence_table_of_a_document_subset():
    table, docs = synthetic_table(0)
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    starts = np.concatenate([np.concatenate([[0], np.cumsum(d)[:-1]]) for d in docs])
    subset = np.array([5, 2, 9])
    sub = sentence_table(offsets, starts, np.array([d.sum() for d in docs]), subset)
    expected = [(p, s, s + n) for p, d in enumerate(subset)
                for s, n in zip(np.concatenate([[0], np.cumsum(docs[d])[:-1]]), docs[d])]
    assert sub.dtype == np.int32 and [tuple(r) for r in sub.T.tolist()] == expected


def test_chain_follows_the_successor_map():
    g = np.random.default_rng(1)
    for n in (1, 2, 7, 1000):
        nxt = np.arange(n) + 1 + g.integers(0, 5, n)
        nxt = np.minimum(nxt, n)
        expected, i = [], 0
        while i < n:
            expected.append(i)
            i = nxt[i]
        assert chain(nxt).tolist() == expected


def test_pair_chunks_equal_berts_greedy_loop():
    table, docs = synthetic_table(2)
    max_tokens = 100
    expected, first = [], 0
    for d in docs:
        i = 0
        while i < len(d):  # create_instances_from_document: add sentences until the target, two at least
            j = i + 1
            while j < len(d) and (d[i:j].sum() < max_tokens or j - i < 2):
                j += 1
            if d[i:j].sum() >= 2:
                expected.append((first + i, first + j, max_tokens))
            i = j
        first += len(d)
    assert [tuple(c) for c in pair_chunks(table, max_tokens, 0.0, seed=3).tolist()] == expected


def test_short_seq_prob_draws_short_targets():
    table, _ = synthetic_table(4, num_docs=3000)
    chunks = pair_chunks(table, 100, 0.3, seed=5)
    short = chunks[:, 2] < 100
    assert 0.25 < short.mean() < 0.35 and chunks[short, 2].min() >= 2
    lengths = table[2] - table[1]
    cum = np.concatenate([[0], np.cumsum(lengths)])
    doc_end = np.searchsorted(table[0], table[0], side="right")
    sizes = cum[chunks[:, 1]] - cum[chunks[:, 0]]
    reached = (sizes >= chunks[:, 2]) | (chunks[:, 1] == doc_end[chunks[:, 0]])
    assert reached.all()
    assert not np.array_equal(chunks, pair_chunks(table, 100, 0.3, seed=6))


def test_packed_chunks_equal_full_sentences_loop():
    table, _ = synthetic_table(7)
    doc, lengths = table[0], table[2] - table[1]
    expected, i = [], 0
    while i < len(doc):
        j, total = i + 1, lengths[i]
        while j < len(doc) and total + lengths[j] + (doc[j] != doc[j - 1]) <= 64:
            total += lengths[j] + (doc[j] != doc[j - 1])
            j += 1
        expected.append((i, j, 64))
        i = j
    assert [tuple(c) for c in packed_chunks(table, 64).tolist()] == expected


def test_windows_cut_the_document_stream():
    lengths = np.array([5, 1, 9, 3, 0, 12])
    doc_of = np.repeat(np.arange(len(lengths)), lengths + 1)  # every token and end-of-document token
    offset_of = np.concatenate([np.arange(n + 1) for n in lengths])
    w = windows(lengths, 4)
    assert len(w) == (len(doc_of) - 1) // 4
    assert np.array_equal(w, np.stack([doc_of, offset_of], axis=1)[::4][:len(w)])


def test_shuffle_is_a_seeded_permutation():
    a = shuffle(1000, Stream.SHUFFLE, 1, epoch=0)
    assert a.dtype == np.uint32 and sorted(a.tolist()) == list(range(1000))
    assert np.array_equal(a, shuffle(1000, Stream.SHUFFLE, 1, epoch=0))
    assert not np.array_equal(a, shuffle(1000, Stream.SHUFFLE, 1, epoch=1))
    assert not np.array_equal(a, shuffle(1000, Stream.SHUFFLE, 2, epoch=0))


def test_split_is_deterministic_by_document_index():
    train, valid = split_documents(100_000, 0.05, seed=3)
    assert len(train) + len(valid) == 100_000 and not np.intersect1d(train, valid).size
    assert abs(len(valid) / 100_000 - 0.05) < 0.003
    # the held-out set of the first documents does not change when documents are appended
    t2, v2 = split_documents(50_000, 0.05, seed=3)
    assert np.array_equal(v2, valid[valid < 50_000])
    assert not np.array_equal(split_documents(100_000, 0.05, seed=4)[1], valid)
    assert len(split_documents(1000, 0.0, seed=3)[1]) == 0


@pytest.mark.parametrize("weights,size", [([0.7, 0.3], 1000), ([1, 1, 1], 10), ([0.5, 0.25, 0.25, 0], 997),
                                          ([3, 1e-3], 5000)])
def test_blend_quotas_and_every_prefix_in_proportion(weights, size):
    index = blend(weights, size)
    q = quotas(weights, size)
    share = np.asarray(weights) / np.sum(weights)
    assert q.sum() == size and np.abs(q - share * size).max() < 1
    for d in range(len(weights)):
        mine = index[:, 0] == d
        assert index[mine, 1].tolist() == list(range(q[d]))  # each dataset's samples in order, once
        prefix = np.cumsum(mine)
        assert np.abs(prefix - np.arange(1, size + 1) * q[d] / size).max() <= 1
    # the closed form equals sorting the ideal times (k + 1/2) / n_d
    times = np.concatenate([(np.arange(n) + 0.5) / n for n in q if n])
    ds = np.concatenate([np.full(n, d) for d, n in enumerate(q) if n])
    assert np.array_equal(index[:, 0], ds[np.lexsort((ds, times))])


def test_index_cache_writes_once_then_maps(tmp_path):
    manifest = {"shards": [{"sha256": "ab" * 32}]}
    cache = IndexCache(str(tmp_path), manifest)
    calls = []

    def build():
        calls.append(1)
        return np.arange(10)

    a = cache.get("x", {"n": 10}, build)
    b = IndexCache(str(tmp_path), manifest).get("x", {"n": 10}, build)
    assert calls == [1] and isinstance(b.base, np.memmap) and np.array_equal(a, b)
    assert [p.name for p in (tmp_path / ".ptm_index").iterdir()] == [cache.filename("x", {"n": 10})]
    assert (tmp_path / ".ptm_index" / cache.filename("x", {"n": 10})).stat().st_mode & 0o777 == 0o644
    cache.get("x", {"n": 11}, build)  # other parameters
    IndexCache(str(tmp_path), {"shards": [{"sha256": "cd" * 32}]}).get("x", {"n": 10}, build)  # other data
    assert len(calls) == 3 and len(list((tmp_path / ".ptm_index").iterdir())) == 3


def test_index_cache_falls_back_to_cache_dir(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / ".ptm_index").write_text("")  # the index folder cannot be created here
    manifest = {"shards": []}
    a = IndexCache(str(data), manifest, cache_dir=str(tmp_path / "cache")).get("x", {}, lambda: np.ones(3))
    assert isinstance(a.base, np.memmap) and len(list((tmp_path / "cache").iterdir())) == 1
    with pytest.warns(UserWarning, match="kept in memory"):
        b = IndexCache(str(data), manifest).get("x", {}, lambda: np.ones(3))
    assert np.array_equal(a, b) and not isinstance(b.base, np.memmap)


def test_index_cache_never_keeps_a_map_cut_short(tmp_path):
    """A full disk (here files over RLIMIT_FSIZE, in a child process) that cuts a small map short, which numpy's
    write does not notice, installs nothing (the map stays in memory); one cut short by an older ptm is built again,
    not read as the sentences of a shorter split ('mmap length is greater than file size')."""
    import multiprocessing
    import resource

    manifest = {"shards": [{"sha256": "ab" * 32}]}
    table = np.arange(600, dtype=np.int32).reshape(3, 200)  # 2.5 KB: within the buffers numpy writes through

    def capped(out):
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
        with pytest.warns(UserWarning, match="kept in memory"):
            out.put(IndexCache(str(tmp_path), manifest).get("sentences", {}, lambda: table).tolist())

    out = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=capped, args=(out,))
    child.start()
    assert np.array_equal(out.get(timeout=30), table)
    child.join(60)
    assert child.exitcode == 0 and list((tmp_path / ".ptm_index").iterdir()) == []
    cache = IndexCache(str(tmp_path), manifest)
    path = tmp_path / ".ptm_index" / cache.filename("sentences", {})
    np.save(path, table)
    path.write_bytes(path.read_bytes()[:1024])  # as an older ptm left it
    assert np.array_equal(cache.get("sentences", {}, lambda: table), table)
    assert np.array_equal(np.load(path), table)


def test_indexes_over_100m_tokens():
    """Fake document and sentence lengths for ~100M tokens (the shapes of a Wikipedia-sized shard set): the
    maps still cover their input exactly (build times: bench/index_build.py)."""
    offsets, local, lengths, doc_lengths = wikipedia_like_shapes()
    counts = np.diff(offsets)
    assert 90e6 < doc_lengths.sum() < 110e6
    table = sentence_table(offsets, local, doc_lengths, np.arange(len(counts)))
    assert np.array_equal(table[0], np.repeat(np.arange(len(counts)), counts))
    assert np.array_equal(table[2] - table[1], lengths)
    lo, hi, _ = pair_chunks(table, 125, 0.1, seed=1).T
    assert (np.diff(lo) > 0).all() and (hi > lo).all() and np.array_equal(table[0, lo], table[0, hi - 1])
    packed = packed_chunks(table, 126)
    assert packed[0, 0] == 0 and np.array_equal(packed[1:, 0], packed[:-1, 1]) and packed[-1, 1] == len(lengths)
    order = shuffle(len(counts), Stream.DOC_ORDER, 1, 0)
    w = windows(doc_lengths[order], 1024)
    assert len(w) == (doc_lengths.sum() + len(counts) - 1) // 1024
    assert (w[:, 1] >= 0).all() and (w[:, 1] <= doc_lengths[order][w[:, 0]]).all()
    samples = shuffle(1_000_000, Stream.SHUFFLE, 1, 0)
    assert samples.dtype == np.uint32 and np.array_equal(np.sort(samples), np.arange(1_000_000))
