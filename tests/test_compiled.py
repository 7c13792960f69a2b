"""Compiled blocks and the multi-tensor optimizer in training, proven to run (not only to match): dynamo's counters
and the profiler's compiled-region events for kernels=compile, a dispatch mode over optimizer steps for
optimizer.multi_tensor=on; activation checkpointing replays dropout exactly, eager and compiled."""
from __future__ import annotations

import collections
import dataclasses
import itertools

import pytest
import torch
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode

from pretrain import kernels as K
from pretrain.models.model import Pretraining
from pretrain.parallel import mcore
from runs import config
from tp_worker import step, tiny


def tiny_bert(train_data, out, *overrides):
    return config(["bert-tiny", f"data.path={train_data}", "data.num_workers=0", "model.hidden_size=32",
                   "model.num_heads=2", "model.ffn_hidden_size=64", "optimizer.warmup_steps=2", "train.eval_interval=0",
                   "data.valid_fraction=0.02", "checkpoint.interval=0", f"out_dir={out}", *overrides])


def compiled_calls(fn) -> int:
    """How many compiled graphs (Inductor's, forward and backward) ran during fn()."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.name.startswith("## Call CompiledFxGraph") for e in prof.events())


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_activation_checkpointing_replays_dropout(compiled):
    """Recomputed blocks draw the same dropout masks (hidden: the default generator; attention: the TP tracker's),
    so checkpointed and plain runs are bit-identical; compiled, no graph holds the tracker's generator switch."""
    torch._dynamo.reset()
    counters.clear()

    def run(**change):
        mcore.initialize(tp=1, seed=0)
        change = {"hidden_dropout": 0.2, "attention_dropout": 0.2, **change}
        model = Pretraining(dataclasses.replace(tiny("bert"), **change))
        if compiled:
            K.compile_model(model)
        loss = step(model.train(), "bert")[1]
        return loss, {n: p.grad for n, p in model.named_parameters()}

    plain, checkpointed = run(), run(activation_checkpointing=True)
    assert torch.equal(plain[0], checkpointed[0])
    assert all(torch.equal(plain[1][n], checkpointed[1][n]) for n in plain[1])
    assert not torch.equal(plain[0], run(attention_dropout=0.0)[0])  # attention dropout was on
    assert not torch.equal(plain[0], run(hidden_dropout=0.0)[0])  # hidden dropout too
    if compiled:
        assert counters["stats"]["unique_graphs"] > 0
        assert not [why for why in counters["graph_break"] if "rng_state" in why]  # dynamo never saw the switch


def test_a_compiled_block_breaks_only_where_attention_dropout_switches_generators():
    """kernels=compile: a block's graphs stop only around its attention core, which runs eager on the TP generator
    (`_on_tp_generator`); megatron-core's RowParallelLinear, which warns on every call (a graph break each), does not
    split them (ptm's subclass hands the matmul its TP group). Measured on an H200: 8 graphs a block and compiled
    blocks slower than eager before."""
    torch._dynamo.reset()
    counters.clear()
    mcore.initialize(tp=1, seed=0)
    cfg = dataclasses.replace(tiny("bert"), hidden_dropout=0.1, attention_dropout=0.1)
    model = Pretraining(cfg)
    K.compile_model(model)
    step(model.train(), "bert")
    reasons = list(counters["graph_break"])
    assert reasons and all("torch.compiler.disable" in why for why in reasons), reasons
    assert compiled_calls(lambda: step(model.train(), "bert")) <= 2 * 3 * cfg.num_layers  # forward + backward


def test_unpadded_training_compiles_once_and_runs_compiled(train_data, tmp_path):
    """kernels=compile with data.unpadded=true: 30 steps over micro-batches of several row counts compile their
    graphs in the first step only (the row count is dynamic), and every step runs the compiled graphs."""
    from pretrain.train import Trainer

    torch._dynamo.reset()
    counters.clear()
    trainer = Trainer(tiny_bert(train_data, tmp_path, "kernels=compile", "data.unpadded=true", "data.seq_len=128",
                                "data.short_seq_prob=0.5", "train.global_batch_size=16", "train.micro_batch_size=8",
                                "train.steps=30"))
    assert trainer.parallel.kernels == "compile"
    source = trainer._sources(0)[0]
    rows = [b["input_ids"].shape[0] for b in itertools.islice(trainer._loader(source, 0, 0), 30 * trainer.accumulation)]
    assert len(set(rows)) >= 3 and min(rows) > 1, rows  # many shapes, none of the one-row specialisation
    micro = trainer._loader(source, 0, 0)
    trainer.train_step(micro)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs > 0
    for _ in range(28):
        trainer.train_step(micro)
    assert compiled_calls(lambda: trainer.train_step(micro)) >= 2 * trainer.accumulation  # forward + backward
    assert counters["stats"]["unique_graphs"] == graphs  # no recompilation for a new row count
    trainer.close()


class ForeachCalls(TorchDispatchMode):
    """The tensor-list lengths of the multi-tensor ops (aten._foreach_*) and the fused AdamW calls that run, and the
    names of every op."""

    def __init__(self):
        super().__init__()
        self.lengths = collections.defaultdict(list)
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        if name.startswith(("_foreach_", "_fused_adamw")):
            self.lengths[name].append(len(args[0]))
        return func(*args, **(kwargs or {}))


LAYOUTS = {"zero0-fp32": ("zero.stage=0",), "zero0-bf16": ("zero.stage=0", "precision=bf16", "grad_accum_dtype=bf16"),
           "zero1-bf16": ("zero.stage=1", "precision=bf16"), "zero2-fp32": ("zero.stage=2",)}


CASES = [*[("lamb", k) for k in LAYOUTS], ("adamw", "zero0-bf16"), ("adamw", "zero1-bf16")]


@pytest.mark.parametrize("name,layout", CASES)
def test_training_steps_through_the_multi_tensor_optimizer(train_data, tmp_path, name, layout):
    """optimizer.multi_tensor=on: DeepSpeed's step runs LAMB's multi-tensor arithmetic, each call over all the tensors
    of a parameter group (every parameter at ZeRO-0; DeepSpeed's flat fp32 partition at ZeRO-1/2, where one tensor
    per call is all there is, and the trust ratios scale its runs of parameters in one call, with no element-wise
    index over the partition); AdamW runs torch's fused kernel over them."""
    from pretrain.train import Trainer

    trainer = Trainer(tiny_bert(train_data, tmp_path, "data.seq_len=32", "model.max_position_embeddings=32",
                                "train.global_batch_size=4", "train.micro_batch_size=4", "train.steps=2",
                                f"optimizer.name={name}", "optimizer.multi_tensor=on", *LAYOUTS[layout]))
    sizes = sorted(len(g["params"]) for g in trainer.optimizer.param_groups)
    with ForeachCalls() as calls:
        trainer.train_step(trainer._loader(trainer._sources(0)[0], 0, 0))
    trainer.close()
    if name == "adamw":
        assert sorted(calls.lengths["_fused_adamw_"]) == sizes
    else:
        assert sorted(calls.lengths["_foreach_lerp_"]) == sizes  # the moments: one call per group
        assert max(calls.lengths["_foreach_add_"]) == max(sizes)  # w -= lr * ratio * u over the whole group
        adapted = sum(p.dim() > 1 for p in trainer.model.parameters())  # the matrices (BERT's recipe)
        assert max(calls.lengths["_foreach_mul_"]) >= adapted  # u *= ratio: every adapted parameter, one call
        assert "repeat_interleave" not in calls.ops
    assert min(sizes) > 1 if layout.startswith("zero0") else sizes == [1, 1]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_encoder_decoder_checkpointing_replays_dropout_in_both_stacks(compiled):
    """T5 with activation checkpointing in the encoder and the decoder (its cross-attention inside the recomputed
    blocks): the loss and every gradient equal a plain run's bit for bit, dropout on, eager and compiled."""
    from pretrain import models
    from pretrain.config import load

    def run(**change):
        torch._dynamo.reset()
        mcore.initialize(tp=1, seed=0)
        change = {"hidden_dropout": 0.2, "attention_dropout": 0.2, **change}
        cfg = dataclasses.replace(load("t5-tiny", ["model.vocab_size=300"]).model, **change)
        model = models.build(cfg).train()
        if compiled:
            K.compile_model(model)
        g = torch.Generator().manual_seed(1)
        ids, targets = torch.randint(0, 300, (2, 24), generator=g), torch.randint(0, 300, (2, 8), generator=g)
        logits = model(ids, decoder_input_ids=targets)["logits"]
        loss = K.cross_entropy(logits, targets).sum()
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    plain, checkpointed = run(), run(activation_checkpointing=True)
    assert torch.equal(plain[0], checkpointed[0])
    assert all(torch.equal(plain[1][n], checkpointed[1][n]) for n in plain[1])
    assert not torch.equal(plain[0], run(hidden_dropout=0.0)[0])  # dropout was on
