"""Loading: identical batches for any worker count, exact resume, disjoint ranks covering each epoch,
blending proportions, and sources from the `data` config."""
import json
import shutil

import numpy as np
import pytest
import torch

from data_prep.dataset import Corpus
from helpers import quick_build
from pretrain.config import Config, DataConfig
from pretrain.data.bert import BertDataset
from pretrain.data.blend import BlendedDataset
from pretrain.data.factory import build_sources
from pretrain.data.gpt import GPTDataset
from pretrain.data.loader import DistributedSampler, make_loader
from pretrain.data.packing import pack
from pretrain.data.masking import Masker


@pytest.fixture(scope="module")
def dataset(small, sp_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("loader") / "ds"
    quick_build([small["path"]], out, tokenizer=sp_model)
    return str(out)


@pytest.fixture(scope="module")
def bert(dataset):
    c = Corpus(dataset)
    return BertDataset(dataset, 64, Masker(c.special_ids, c.vocab_size, strategy="whole_word"), seed=5)


def collect(loader):
    return [{k: v.clone() for k, v in batch.items()} for batch in loader]


def equal(a, b):
    return len(a) == len(b) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
                                    for x, y in zip(a, b))


def test_same_batches_for_any_worker_count(bert):
    runs = {}
    for workers in (0, 1, 2):
        loader = make_loader(bert, 8, total_samples=96, num_workers=workers)
        assert loader.pin_memory == torch.cuda.is_available()
        state = torch.get_rng_state()
        runs[workers] = collect(loader)
        assert torch.equal(torch.get_rng_state(), state)  # the global RNG (dropout) is left alone
    batch = runs[0][0]
    assert all(v.dtype == torch.int64 for v in batch.values()) and batch["input_ids"].shape == (8, 64)
    assert batch["next_sentence_label"].shape == (8,) and len(runs[0]) == 12
    assert equal(runs[0], runs[1]) and equal(runs[0], runs[2])


def test_a_worker_found_dead_is_named_by_the_signal_that_ended_it(bert):
    """torch says only "exited unexpectedly" of a worker it finds dead without its signal handler's word (the signal
    came while that handler's error was swallowed: once in its profiler's first import): the signal comes from the
    worker's exit status, so a SIGBUS (a full /dev/shm) is not named the out-of-memory killer's."""
    import os
    import signal
    import time

    from pretrain.data.loader import end_workers, worker_death

    batches = iter(make_loader(bert, 8, total_samples=96, num_workers=1))
    next(batches)
    worker = batches._workers[0]
    os.kill(worker.pid, signal.SIGBUS)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:  # (torch's SIGCHLD handler raises its own word wherever the main process is: here, in the wait)
            if worker.exitcode is not None:
                break
            time.sleep(0.05)
        except RuntimeError:
            pass
    said = worker_death(RuntimeError(f"DataLoader worker (pid(s) {worker.pid}) exited unexpectedly"))
    end_workers(batches)
    assert said.startswith(f"data-loader worker (pid {worker.pid}) was killed by SIGBUS: shared memory (/dev/shm) "
                           "ran out"), said


def test_unpadded_batches_are_packed_in_the_workers(bert):
    padded = collect(make_loader(bert, 8, total_samples=32, num_workers=0))
    packed = collect(make_loader(bert, 8, total_samples=32, num_workers=2, unpadded=True))
    assert "sample_index" in packed[0] and "attention_mask" not in packed[0]
    assert equal(packed, [pack(b) for b in padded])


def test_resume_from_consumed_samples_equals_the_tail_of_a_fresh_run(bert):
    n = len(bert)
    total = n + 64  # crosses into epoch 1
    fresh = list(DistributedSampler(bert, world_size=4, rank=1, total_samples=total))
    resumed = list(DistributedSampler(bert, world_size=4, rank=1, consumed_samples=n - 20, total_samples=total))
    assert resumed == fresh[-len(resumed):] and resumed[0] == divmod(n - 20 + 1, n) and fresh[-1][0] == 1
    full = collect(make_loader(bert, 8, total_samples=80, num_workers=2))
    tail = collect(make_loader(bert, 8, consumed_samples=40, total_samples=80, num_workers=2))
    assert equal(full[5:], tail)
    endless = iter(make_loader(bert, 8, consumed_samples=40, num_workers=0))
    assert equal([next(endless) for _ in range(5)], tail)


@pytest.mark.parametrize("world,consumed", [(3, 0), (4, 6)])
def test_ranks_are_disjoint_and_cover_every_epoch(bert, world, consumed):
    n = len(bert)
    keys = [list(DistributedSampler(bert, rank=r, world_size=world, consumed_samples=consumed,
                                    total_samples=2 * n + 7)) for r in range(world)]
    for epoch in (0, 1):
        per_rank = [{i for e, i in k if e == epoch} for k in keys]
        assert sum(map(len, per_rank)) == len(set().union(*per_rank))  # disjoint
        assert set().union(*per_rank) == set(range(consumed if epoch == 0 else 0, n))  # the whole epoch
    assert max(map(len, keys)) - min(map(len, keys)) <= 1
    batch = next(iter(make_loader(bert, 4, rank=1, world_size=world, consumed_samples=consumed, num_workers=0)))
    expected = [bert.sample(*k) for k in keys[1][:4]]
    assert torch.equal(batch["input_ids"], torch.from_numpy(np.stack([s["input_ids"] for s in expected])))


def test_blending_in_proportion_with_each_source_as_a_stream_of_epochs(dataset):
    c = Corpus(dataset)
    half = len(c) // 2
    sources = [GPTDataset(dataset, 32, seed=1, docs=np.arange(half)),
               GPTDataset(dataset, 32, seed=1, docs=np.arange(half, half + 8))]
    blend = BlendedDataset(sources, [0.75, 0.25], size=1000)
    assert len(blend) == 1000 and blend.quota.tolist() == [750, 250] and len(sources[1]) < 250
    index = np.asarray(blend.index)
    prefix = np.cumsum(index[:, 0] == 1)
    assert np.abs(prefix - 0.25 * np.arange(1, 1001)).max() <= 1
    drawn = {0: [], 1: []}
    for epoch in (0, 1):
        blend.prepare(epoch)
        for i in range(0, 1000, 7):
            d, k = index[i]
            draw = divmod(epoch * blend.quota[d] + k, len(sources[d]))
            drawn[d].append(draw)
            assert np.array_equal(blend.sample(epoch, i)["input_ids"], sources[d].sample(*draw)["input_ids"])
    assert max(e for e, _ in drawn[1]) >= 2  # the small source was used up and reshuffled
    assert all(len(set(v)) == len(v) for v in drawn.values())
    batch = next(iter(make_loader(blend, 4, num_workers=0)))
    assert batch["input_ids"].shape == (4, 32)
    assert BlendedDataset(sources).quota.tolist() == [len(s) for s in sources]


def test_sources_from_the_data_config(dataset, tmp_path):
    data = DataConfig(path=[dataset, dataset], weights=[0.5, 0.5], seq_len=64, objective="mlm_sop",
                      masking="knowledge", valid_fraction=0.1)
    train, valid = build_sources(Config(data=data, seed=3))
    assert isinstance(train, BlendedDataset) and isinstance(valid, BlendedDataset)
    part = train.sources[0]
    assert part.masker.max_predictions == 10 and part.masker.span_kinds == ("phrase", "entity")
    assert not np.intersect1d(part.docs, valid.sources[0].docs).size
    assert len(part.docs) + len(valid.sources[0].docs) == len(Corpus(dataset))
    assert "next_sentence_label" in train.sample(0, 0)
    gpt, none = build_sources(Config(data=DataConfig(path=dataset, seq_len=64, objective="clm", valid_fraction=0), seed=3))
    assert isinstance(gpt, GPTDataset) and none is None
    with pytest.raises(ValueError, match="data.objective .bort. is not one of mlm_nsp"):
        build_sources(Config(data=DataConfig(path=dataset, objective="bort"), seed=3))
    with pytest.raises(ValueError, match="needs the current stage's tasks"):
        build_sources(Config(data=DataConfig(path=dataset, objective="ernie"), seed=3))
    with pytest.raises(ValueError) as e:  # the fix said once
        build_sources(Config(data=DataConfig(path=dataset, seq_len=64, valid_fraction=1e-12), seed=3))
    assert str(e.value) == f"validation split: {dataset}: data.valid_fraction=1e-12 holds out no document; raise it, " \
        "or set it to 0 to train without validation"
    other = shutil.copytree(dataset, tmp_path / "other", ignore=shutil.ignore_patterns(".ptm_index"))
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["tokenizer"]["sha256"] = "0" * 64
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="different tokenizers"):
        build_sources(Config(data=DataConfig(path=[dataset, str(other)], seq_len=64), seed=3))
