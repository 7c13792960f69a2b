"""Unpadded (packed) masked-LM batches give the padded batch's loss terms and gradients, in fewer rows."""
import dataclasses

import pytest
import torch

from pretrain import objectives
from pretrain.data.packing import pack, padding_fraction, rows_for
from pretrain.models.model import Pretraining
from pretrain.parallel import mcore
from tp_worker import tiny


def padded_batch(lengths, seq_len=16, vocab=250, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    real = torch.arange(seq_len)[None] < torch.tensor(lengths)[:, None]
    ids = torch.randint(5, vocab, (b, seq_len), generator=g) * real
    masked = real & (torch.rand(b, seq_len, generator=g) < 0.3)
    return {"input_ids": ids, "attention_mask": real.long(), "labels": torch.where(masked, ids, -100),
            "token_type_ids": (torch.arange(seq_len)[None] >= torch.tensor(lengths)[:, None] // 2).long() * real,
            "next_sentence_label": torch.randint(0, 2, (b,), generator=g)}


def test_rows_first_fit_decreasing():
    assert rows_for([16, 3, 9, 7, 5, 12], 16) == [[0], [5, 1], [2, 3], [4]]
    assert sum(map(len, rows_for([1] * 40, 16))) == 40


def test_packed_batch_gives_the_padded_loss_and_gradients():
    lengths = [16, 3, 9, 7, 5, 12, 2, 16]
    batch = padded_batch(lengths)
    packed = pack(batch)
    assert packed["input_ids"].shape == (5, 16)  # 8 samples, 70 tokens: 5 rows instead of 8
    assert padding_fraction(batch) == pytest.approx(1 - 70 / 128)
    assert padding_fraction(packed) == pytest.approx(1 - 70 / 80)
    results = []
    for b in (batch, packed):
        mcore.initialize(tp=1, seed=0)
        model = Pretraining(dataclasses.replace(tiny("bert"), max_position_embeddings=16)).train()
        terms = objectives.get("mlm_nsp").compute(model, b)
        sum(t.loss for t in terms.values()).backward()
        results.append((terms, {n: p.grad for n, p in model.named_parameters()}))
    (padded, grads), (unpadded, packed_grads) = results
    for name in ("mlm", "nsp"):
        assert int(padded[name].count) == int(unpadded[name].count)
        torch.testing.assert_close(unpadded[name].loss, padded[name].loss, rtol=1e-5, atol=1e-5)
        assert int(padded[name].correct) == int(unpadded[name].correct)
    for name, grad in grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_packing_without_the_block_diagonal_mask_would_differ():
    """The test above can fail: attention across samples of a row changes the loss."""
    batch = padded_batch([7, 5, 3, 9])
    packed = pack(batch)
    mcore.initialize(tp=1, seed=0)
    model = Pretraining(dataclasses.replace(tiny("bert"), max_position_embeddings=16)).train()
    fields = {k: packed[k] for k in ("input_ids", "token_type_ids", "position_ids")}
    right = model.encode(**fields, sample_index=packed["sample_index"])
    leaky = model.encode(**fields, sample_index=(packed["sample_index"] > 0).long())  # one "sample" per row
    real = packed["sample_index"] > 0
    assert (right - leaky)[real].abs().max() > 1e-2


def test_packed_ernie2_batch_gives_the_padded_task_terms_and_gradients():
    """ERNIE 2.0: per-token tasks (capitalisation) select their tokens through each token's task, sequence tasks
    (sentence distance) pool each sample's [CLS], knowledge masking is masked LM."""
    from pretrain.config import Config
    from pretrain.objectives.ernie import TASK_SPECS, TASKS, ErnieStage

    tasks = ("knowledge_masking", "capitalization", "sentence_distance")
    lengths = [16, 3, 9, 7, 5, 12]
    batch = padded_batch(lengths)
    del batch["next_sentence_label"]
    g = torch.Generator().manual_seed(1)
    task = torch.tensor([TASKS.index(tasks[i % 3]) for i in range(len(lengths))])
    real = batch["attention_mask"].bool()
    batch.update(task=task, seq_label=torch.randint(0, 3, (len(lengths),), generator=g),
                 task_type_ids=torch.tensor([TASK_SPECS[TASKS[t]].group for t in task])[:, None] * real,
                 token_labels=torch.where(real & (task[:, None] == TASKS.index("capitalization")),
                                          torch.randint(0, 2, real.shape, generator=g), -100))
    batch["labels"] = torch.where(task[:, None] == TASKS.index("knowledge_masking"), batch["labels"], -100)
    packed = pack(batch)
    assert packed["input_ids"].shape[0] < len(lengths)
    results = []
    for b in (batch, packed):
        mcore.initialize(tp=1, seed=0)
        cfg = dataclasses.replace(tiny("ernie"), max_position_embeddings=16, task_type_vocab_size=3)
        model = Pretraining(cfg, heads=objectives.get("ernie").heads(Config(model=cfg))).train()
        terms = objectives.get("ernie").compute(model, b, ErnieStage(tasks=dict.fromkeys(tasks, 1.0)))
        sum(t.loss for t in terms.values()).backward()
        results.append((terms, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (padded, grads), (unpadded, packed_grads) = results
    assert set(padded) == {"mlm", "capitalization", "sentence_distance"} == set(unpadded)
    for name in padded:
        assert int(padded[name].count) == int(unpadded[name].count) > 0, name
        torch.testing.assert_close(unpadded[name].loss, padded[name].loss, rtol=1e-5, atol=1e-5, msg=name)
    assert grads.keys() == packed_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
