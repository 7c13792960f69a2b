"""Training: samples are deterministic and rank-disjoint, resume is exact, bad configs fail early."""
import json

import numpy as np
import pytest
import torch

from conftest import run_cli
from helpers import quick_build
from pretrain.config import load
from pretrain.data.pipeline import BertSamples, GPTSamples, Samples, batches, split_documents
from data_prep.dataset import Corpus


@pytest.fixture(scope="module")
def dataset(small, sp_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "ds"
    quick_build([small["path"]], out, tokenizer=sp_model)
    return str(out)


def _cfg(dataset, *overrides, preset="bert-tiny"):
    return load(preset, [f"data.path={dataset}", "data.num_workers=0", "data.seq_len=32",
                         "model.max_position_embeddings=32", "train.global_batch_size=8", "train.micro_batch_size=4",
                         "optimizer.warmup_steps=2", "train.eval_interval=0", "model.hidden_dropout=0.1", *overrides])


def test_samples_are_pure_functions_of_seed_epoch_index(dataset):
    cfg = _cfg(dataset)
    corpus = Corpus(dataset)
    docs = split_documents(corpus, cfg.data.valid_fraction, cfg.seed, "train")
    a, b = BertSamples(corpus, docs, cfg.data, cfg.seed), BertSamples(Corpus(dataset), docs, cfg.data, cfg.seed)
    for i in (0, 7, len(a) - 1):
        x, y = a(i, np.random.default_rng([1, 2, i])), b(i, np.random.default_rng([1, 2, i]))
        assert all(np.array_equal(x[k], y[k]) for k in x)
    one = [next(batches(cfg, [corpus], "train", 4, 0, 1, start=s, workers=0)) for s in (0, 4, 8)]
    two = batches(cfg, [corpus], "train", 4, 0, 1, start=0, workers=2)
    for expected in one:
        got = next(two)
        assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_data_parallel_ranks_see_disjoint_samples_covering_the_epoch():
    class Indices:  # a builder whose samples are their own index
        def __len__(self):
            return 100

        def __call__(self, index, rng, position):
            return {"index": np.array([index])}

    for epoch in range(2):
        seen = []
        for rank in range(3):
            data = Samples(Indices(), seed=5, dp_rank=rank, dp=3)
            seen += [int(data[epoch * data.per_epoch + k]["index"]) for k in range(data.per_epoch)]
        assert len(seen) == len(set(seen)) == 99  # disjoint, and 99 of the 100 samples (100 // 3 per rank)
    first = [int(Samples(Indices(), 5, 0, 1)[k]["index"]) for k in range(100)]
    second = [int(Samples(Indices(), 5, 0, 1)[100 + k]["index"]) for k in range(100)]
    assert sorted(first) == sorted(second) == list(range(100)) and first != second  # reshuffled per epoch


def test_gpt_windows_reproduce_the_token_stream(dataset):
    corpus = Corpus(dataset)
    docs = split_documents(corpus, 0.01, 0, "train")[:40]
    builder = GPTSamples(corpus, docs, 16)
    eod = corpus.special_ids["eod"]
    stream = np.concatenate([np.append(corpus.tokens(int(d)), eod) for d in docs])
    for i in range(len(builder)):
        s = builder(i, None)
        assert np.array_equal(s["input_ids"], stream[i * 16:i * 16 + 16])
        assert np.array_equal(s["labels"], stream[i * 16 + 1:i * 16 + 17])


def test_masking_statistics(dataset):
    cfg = _cfg(dataset, "data.masking=whole_word")
    corpus = Corpus(dataset)
    b = BertSamples(corpus, split_documents(corpus, 0.01, 0, "train"), cfg.data, 0)
    masked = total = as_mask = 0
    special = set(corpus.special_ids.values())
    for i in range(300):
        s = b(i % len(b), np.random.default_rng([0, 0, i]))
        chosen = s["labels"] != -100
        real = (s["attention_mask"] == 1) & ~np.isin(s["input_ids"], [corpus.special_ids["cls"], corpus.special_ids["sep"]])
        assert not np.isin(s["labels"][chosen], [corpus.special_ids["cls"], corpus.special_ids["sep"],
                                                 corpus.special_ids["pad"]]).any()
        assert chosen.sum() <= int(np.ceil(0.15 * 32))
        masked += chosen.sum()
        total += (real | chosen).sum()
        as_mask += (s["input_ids"][chosen] == corpus.special_ids["mask"]).sum()
    assert 0.10 < masked / total < 0.16
    assert 0.75 < as_mask / masked < 0.85
    assert special


def test_resume_is_exact(dataset, tmp_path):
    """A run stopped after step 3 (as if killed after its checkpoint) and restarted ends bit-identical to a
    run that never stopped: weights, optimizer moments, data position, validation loss."""
    from safetensors.torch import load_file

    from pretrain.data.pipeline import batches as make_batches
    from pretrain.train import Trainer

    def cfg(out):
        return _cfg(dataset, f"out_dir={out}", "train.steps=6", "checkpoint.interval=0")

    straight = Trainer(cfg(tmp_path / "a")).fit()
    first = Trainer(cfg(tmp_path / "b"))
    micro = make_batches(first.cfg, first.corpora, "train", 4, 0, 1, start=0, workers=0)
    for _ in range(3):
        first.train_step(micro)
    first.save()  # ...and the process dies here
    resumed = Trainer(cfg(tmp_path / "b")).fit()
    assert resumed["trained_steps"] == 3 and straight["trained_steps"] == 6
    ckpt = [tmp_path / run / "checkpoints" / "step_00000006" for run in ("a", "b")]
    wa, wb = (load_file(c / "model-tp00.safetensors") for c in ckpt)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ta, tb = (torch.load(c / "trainer-tp00.pt", weights_only=False) for c in ckpt)
    assert ta["consumed"] == tb["consumed"] == 48
    assert all(torch.equal(ta["optimizer"]["state"][k]["exp_avg_sq"], tb["optimizer"]["state"][k]["exp_avg_sq"])
               for k in ta["optimizer"]["state"])
    assert straight["valid_mlm_loss"] == resumed["valid_mlm_loss"]


def test_bad_configs_fail_before_training(dataset, tmp_path):
    base = ["pretrain", "train", "--config", "bert-tiny", "--set", f"data.path={dataset}", f"out_dir={tmp_path}"]
    proc = run_cli(*base, "model.hidden_sizes=3", check=False)
    assert proc.returncode == 2 and "hidden_sizes" in proc.stderr and "hidden_size" in proc.stderr
    proc = run_cli(*base, "model.num_heads=3", check=False)
    assert proc.returncode == 2 and "num_heads" in proc.stderr
    proc = run_cli(*base, "model.vocab_size=999", check=False)
    assert proc.returncode == 2 and "does not match the dataset's tokenizer" in proc.stderr
    proc = run_cli("pretrain", "train", "--config", "bert-tiny", "--set", f"data.path={tmp_path}/none",
                   f"out_dir={tmp_path}", check=False)
    assert proc.returncode == 2 and "no manifest.json" in proc.stderr
    assert not (tmp_path / "checkpoints").exists()


def test_gpt2_tiny_trains_and_reports_perplexity(dataset, tmp_path):
    from pretrain.train import train

    summary = train(load("gpt2-tiny", [f"data.path={dataset}", f"out_dir={tmp_path}", "train.steps=4",
                                       "data.num_workers=0", "data.seq_len=32", "train.global_batch_size=4",
                                       "train.micro_batch_size=2", "optimizer.warmup_steps=1",
                                       "train.eval_interval=0"]))
    assert summary["steps"] == 4 and summary["valid_ppl"] > 1
    assert json.load(open(tmp_path / "summary.json"))["steps"] == 4


def test_ernie2_two_stage_schedule(dataset, tmp_path):
    """Stage 1's samples come from stage 1's tasks only; stage 2 adds its tasks; every task's head trains."""
    from pretrain.data.ernie import TASKS, ErnieSamples
    from pretrain.data.pipeline import split_documents
    from pretrain.train import train

    cfg = load("ernie-tiny", [f"data.path={dataset}", f"out_dir={tmp_path}", "data.num_workers=0",
                              "data.seq_len=32", "model.max_position_embeddings=32"])
    corpus = Corpus(dataset)
    builder = ErnieSamples(corpus, split_documents(corpus, 0.01, 0, "train"), cfg)
    batch = cfg.train.global_batch_size
    stage1 = {TASKS[int(builder(i % len(builder), np.random.default_rng(i), i)["task"])] for i in range(4 * batch)}
    stage2 = {TASKS[int(builder(i % len(builder), np.random.default_rng(i), i)["task"])]
              for i in range(4 * batch, 8 * batch)}
    assert stage1 == set(cfg.ernie.stages[0].tasks) and stage2 == set(cfg.ernie.stages[1].tasks)
    sample = next(builder(i, np.random.default_rng(i), 0) for i in range(50)
                  if TASKS[int(builder(i, np.random.default_rng(i), 0)["task"])] == "capitalization")
    assert (sample["labels"] == -100).all() and (sample["token_labels"] != -100).any()
    assert (sample["task_type_ids"] == 0).all()
    summary = train(cfg)
    for task in ("mlm", "sentence_reordering", "sentence_distance"):
        assert f"valid_{task}_acc" in summary, summary
