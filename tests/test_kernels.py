"""Kernel choices against their references on CPU: compiled transformer blocks (torch.compile, Inductor) against
eager ones, liger-kernel's fused linear cross-entropy (Triton, interpreted: TRITON_INTERPRET=1 from conftest)
against logits + megatron-core's cross-entropy (fp32, bf16 and fp16 weights; in training under ZeRO-3, counting its
calls), the choice per device and precision, and the attention kernel the log names."""
import collections
import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pretrain import config as C
from pretrain import models, objectives
from pretrain import kernels as K
from pretrain.engine import _fused_lm_loss
from pretrain.models.model import Pretraining
from pretrain.optim.optimizers import Lamb
from pretrain.parallel import mcore
from tp_worker import step, tiny


def run(cfg, compiled: bool):
    mcore.initialize(tp=1, seed=0)
    model = Pretraining(cfg).train()
    if compiled:
        K.compile_model(model)
    logits, loss = step(model, cfg.arch)
    return model, logits, loss, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_compiled_blocks_match_eager(arch):
    """fp32 logits, loss and every gradient within 1e-5 of eager (dropout off: Inductor draws its own masks)."""
    torch._dynamo.reset()
    eager, compiled = run(tiny(arch), False), run(tiny(arch), True)
    assert all(b._compiled_call_impl is not None for b in compiled[0].blocks)  # the blocks did compile
    torch.testing.assert_close(compiled[1], eager[1], rtol=0, atol=1e-5)
    torch.testing.assert_close(compiled[2], eager[2], rtol=0, atol=1e-5)
    for name, grad in eager[3].items():
        torch.testing.assert_close(compiled[3][name], grad, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("arch", ["bert", "xlnet"])
def test_one_tp_rank_runs_plain_linears_not_megatron_cores(arch, monkeypatch):
    """With one TP rank the parallel linear layers are `F.linear` (issue 39: megatron-core's per-call Python is host
    time): its autograd Function runs for none of them, and the logits, loss and every gradient are those of its
    path (forced on the same model) bit for bit."""
    from megatron.core.tensor_parallel import layers as megatron_layers

    calls = collections.Counter()
    function = megatron_layers.LinearWithGradAccumulationAndAsyncCommunication
    apply = function.apply
    monkeypatch.setattr(function, "apply", lambda *args: (calls.update(["megatron"]), apply(*args))[1])
    cfg = tiny(arch)
    cls = models.model_class(cfg)

    def run_linears(fast: bool):
        mcore.initialize(tp=1, seed=0)
        model = cls(cfg).train()
        linears = [m for m in model.modules() if hasattr(m, "alone")]
        assert linears and all(m.alone for m in linears)
        for m in linears:
            m.alone = fast
        calls.clear()
        logits, loss = step(model, arch)
        return calls["megatron"], logits, loss, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    fast, reference = run_linears(True), run_linears(False)
    assert fast[0] == 0 and reference[0] >= 4 * cfg.num_layers
    torch.testing.assert_close(fast[1:3], reference[1:3], rtol=0, atol=0)
    assert fast[3].keys() == reference[3].keys()
    for name, grad in reference[3].items():
        torch.testing.assert_close(fast[3][name], grad, rtol=0, atol=0, msg=name)


def test_auto_runs_eager_blocks_and_compile_is_a_choice():
    """auto is eager on CPU and CUDA at every ZeRO stage (compiled blocks measured slower on an H200)."""
    def kernels(setting, cuda, stage):
        return C.load("bert-tiny", [f"kernels={setting}", f"zero.stage={stage}"]).kernels_on(cuda)

    assert {kernels("auto", cuda, stage) for cuda in (False, True) for stage in range(4)} == {"eager"}
    assert kernels("compile", False, 0) == kernels("compile", True, 1) == "compile"


def test_compile_under_data_parallel_zero2_is_refused_with_the_reason(tmp_path):
    cfg = C.load("bert-tiny", [f"data.path={tmp_path}", "kernels=compile", "zero.stage=2"])
    cfg.validate(dp=1)
    with pytest.raises(C.ConfigError, match="kernels=compile with zero.stage=2 over 2 data-parallel ranks trains wrong"):
        cfg.validate(dp=2)


def fused_case(n=37, hidden=16, vocab=101, rows=128, seed=0):
    """Ragged shapes: 37 tokens, 101 real vocabulary rows of 128, some labels ignored."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, hidden, generator=g)
    weight, bias = torch.randn(rows, hidden, generator=g) * 0.5, torch.randn(rows, generator=g) * 0.1
    labels = torch.randint(0, vocab, (n,), generator=g)
    labels[::5] = -100
    return x, weight, bias, labels, vocab


class Ops(TorchDispatchMode):
    """Counts the aten ops that run."""

    def __init__(self):
        super().__init__()
        self.seen = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen[str(func)] += 1
        return func(*args, **(kwargs or {}))


SYNCS = ("aten._local_scalar_dense.default", "aten.equal.default", "aten.nonzero.default")  # the host waits for a GPU


def lm_loss(x, weight, bias, labels, vocab, fused: bool, dtype=torch.float32):
    """(loss, correct, [x, weight, bias gradients]) of the fused kernel or of the logits + megatron-core's
    cross-entropy in `dtype`, for a loss scaled by 0.5 (as the trainer scales it)."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (x, weight, bias)]
    if fused:
        loss, correct = K.linear_cross_entropy(*leaves, labels, vocab)
        assert type(loss.grad_fn).__name__ == "_FusedLinearCrossEntropyBackward"  # the fused loop, not a fallback
    else:
        logits = (leaves[0] @ leaves[1].T + leaves[2]).masked_fill(torch.arange(len(weight)) >= vocab,
                                                                   torch.finfo(dtype).min)
        loss = K.cross_entropy(logits, labels).sum()
        correct = ((logits.argmax(-1) == labels) & (labels != -100)).sum()
    (loss * 0.5).backward()
    return loss.detach(), correct, [t.grad for t in leaves]


@pytest.mark.parametrize("budget, chunks", [(None, [(37,)]), (0, [(8,)] * 4 + [(5,)])], ids=["budget", "liger"])
def test_fused_linear_cross_entropy_matches_logits_and_cross_entropy(monkeypatch, budget, chunks):
    """fp32: loss, correct count and gradients of the fused loop (liger's Triton kernel per chunk) equal the logits
    path's, and neither its forward nor its backward syncs with the host (liger's own `fused_linear_cross_entropy`
    made two: `.item()` on the label count, `torch.equal` on the incoming gradient); the kernel ran once per chunk:
    37 tokens' 37 x 101 logits fit FUSED_CHUNK_BYTES in one; with no budget, liger's sizing makes chunks of 8 (a
    chunk's 8 x 101 logits ~ the 37 x 16 input)."""
    pytest.importorskip("liger_kernel")
    if budget is not None:
        monkeypatch.setattr(K, "FUSED_CHUNK_BYTES", budget)
    assert K.fused_lm_loss_available(torch.device("cpu")) is None
    mcore.initialize(tp=1, seed=0)
    from liger_kernel.ops import cross_entropy as liger

    calls, launches, kernel = K.fused_lm_loss_calls, [], liger.liger_cross_entropy_kernel
    run = kernel.run  # what `kernel[grid](...)` calls, interpreted or compiled

    def counted(*args, **kwargs):
        launches.append(kwargs["grid"])
        return run(*args, **kwargs)

    kernel.run = counted
    try:
        with Ops() as ops:
            fused_loss, fused_correct, fused_grads = lm_loss(*fused_case(), fused=True)
    finally:
        del kernel.run
    assert K.fused_lm_loss_calls == calls + 1
    assert launches == chunks
    assert [ops.seen[op] for op in SYNCS] == [0, 0, 0]
    loss, correct, grads = lm_loss(*fused_case(), fused=False)
    torch.testing.assert_close(fused_loss, loss, rtol=1e-5, atol=1e-5)
    assert int(fused_correct) == int(correct) > 0
    for got, want in zip(fused_grads, grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert fused_grads[1][101:].abs().sum() == 0  # the padding rows are out of the softmax


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_gradients_of_half_weights_are_summed_in_fp32(monkeypatch, dtype):
    """Half-precision weights (DeepSpeed's bf16/fp16 models): the weight and bias gradients are summed over 32
    chunks of 4 tokens (liger's sizing, with no FUSED_CHUNK_BYTES budget). Summed in fp32 (`accum_dtype`) they are
    as close to the fp32 gradients as the logits path's in the same dtype (within 2.5x; 1.0-1.4x measured); summed
    in the weights' dtype they were 3.6-7.7x further off (inputs with a common component and a flat softmax: the
    chunks' contributions add up)."""
    pytest.importorskip("liger_kernel")
    monkeypatch.setattr(K, "FUSED_CHUNK_BYTES", 0)
    mcore.initialize(tp=1, seed=0)
    x, weight, bias, labels, vocab = fused_case(n=128, hidden=16, vocab=512, rows=576)
    case = (1 + 0.1 * x, 0.2 * weight, bias, labels, vocab)
    _, _, want = lm_loss(*case, fused=False)
    _, _, fused = lm_loss(*case, fused=True, dtype=dtype)
    _, _, logits = lm_loss(*case, fused=False, dtype=dtype)

    def error(got, want):
        return ((got.float() - want).norm() / want.norm()).item()

    for name, got, same_dtype, exact in zip(("input", "weight", "bias"), fused, logits, want):
        ours, theirs = error(got, exact), error(same_dtype, exact)
        assert got.dtype == dtype and ours <= 2.5 * theirs, (name, ours, theirs)


def test_training_runs_the_fused_loss_once_per_micro_batch_under_zero3(train_data, tmp_path):
    """fused_lm_loss=on: each training micro-batch's MLM loss goes through the kernel (one step of 2 micro-batches;
    not the evaluation's), and under ZeRO-3 (the tied embedding gathered for the head) the logged loss, accuracy and
    gradient norm and the trained weights equal those of the logits path (fused_lm_loss=off) within 1e-5."""
    pytest.importorskip("liger_kernel")
    from pretrain.train import Trainer
    from runs import max_rel_diff, weights

    def train(fused: str) -> list[dict]:
        cfg = C.load("bert-tiny", [f"data.path={train_data}", f"out_dir={tmp_path / fused}", f"fused_lm_loss={fused}",
                                   "zero.stage=3", "data.num_workers=0", "data.seq_len=32",
                                   "model.max_position_embeddings=32", "model.hidden_dropout=0",
                                   "model.attention_dropout=0", "train.global_batch_size=4", "train.micro_batch_size=2",
                                   "train.steps=1", "train.eval_interval=1", "train.eval_steps=1",
                                   "data.valid_fraction=0.02", "optimizer.warmup_steps=1", "checkpoint.interval=0"])
        calls, trainer = K.fused_lm_loss_calls, Trainer(cfg)
        try:
            trainer.fit()
        finally:
            trainer.close()
        assert K.fused_lm_loss_calls - calls == (2 if fused == "on" else 0)
        assert (tmp_path / fused / "valid.jsonl").exists()  # it evaluated, without the fused loss
        return [json.loads(line) for line in open(tmp_path / fused / "metrics.jsonl")]

    fused, reference = train("on"), train("off")
    for row, want in zip(fused, reference, strict=True):
        for key in ("mlm_loss", "mlm_acc", "nsp_loss", "grad_norm"):
            assert row[key] == pytest.approx(want[key], rel=1e-5), key
    assert max_rel_diff(weights(tmp_path / "on"), weights(tmp_path / "off"), heads=2) < 1e-5


def test_fused_lm_loss_is_refused_where_it_cannot_apply(tmp_path):
    """TP>1 (the vocabulary is split) and fp16 (liger computes the gradients before the loss scale): `on` is one
    config error, `auto` falls back to the logits path and the log line says why under fp16."""
    cfg = C.load("bert-tiny", [f"data.path={tmp_path}", "fused_lm_loss=on", "parallel.tp=2"])
    with pytest.raises(C.ConfigError, match="fused_lm_loss=on needs the whole vocabulary on one rank"):
        cfg.validate()
    cfg = C.load("bert-tiny", [f"data.path={tmp_path}", "fused_lm_loss=on", "precision=fp16"])
    with pytest.raises(C.ConfigError, match="^fused_lm_loss=on with precision=fp16: liger-kernel computes the LM "
                                            "head's gradients before the fp16 loss scale"):
        cfg.validate()
    cuda = torch.device("cuda", 0)
    for precision, fused in (("fp16", False), ("bf16", True), ("fp32", True)):
        cfg = C.load("bert-tiny", [f"data.path={tmp_path}", f"precision={precision}", "zero.stage=1"])
        assert _fused_lm_loss(cfg, cuda) is fused
        assert cfg.lm_loss_fusable() is fused  # the speed model's answer too
    line = K.describe(cfg, "eager", False, Lamb([torch.zeros(1)]), torch.device("cpu"))
    assert "LM head megatron-core vocab-parallel cross-entropy; " in line
    cfg.precision = "fp16"
    line = K.describe(cfg, "eager", False, Lamb([torch.zeros(1)]), torch.device("cpu"))
    assert ("LM head megatron-core vocab-parallel cross-entropy (not fused under fp16: liger-kernel computes its "
            "gradients before the loss scale)") in line


@pytest.mark.parametrize("preset, overrides, attention", [
    ("bert-tiny", [], "torch SDPA math (padding mask)"),  # attention dropout: no CPU flash kernel
    ("bert-tiny", ["model.attention_dropout=0"], "torch SDPA flash (padding mask)"),
    ("bert-tiny", ["model.attention_dropout=0", "data.unpadded=true"], "torch SDPA flash (block-diagonal mask)"),
    ("gpt2-tiny", ["model.attention_dropout=0"], "torch SDPA flash (causal, no mask)"),
    ("gpt3-tiny", ["model.attention_dropout=0"], "torch SDPA flash (causal, no mask); local layers torch SDPA flash "
                                                 "(band mask)"),  # GPT-3's alternating layers: the band as a mask
    ("nezha-tiny", [], "ptm's matmuls + softmax (relative positions)"),
    ("transfo-xl-tiny", ["model.attention_dropout=0"], "ptm's matmuls + softmax (Transformer-XL's relative positions)"),
    ("xlnet-tiny", ["model.attention_dropout=0"], "ptm's matmuls + softmax (Transformer-XL's relative positions)"),
])
def test_the_log_names_the_attention_kernel_that_runs(preset, overrides, attention):
    """The `kernels:` line names the kernel SDPA picks for the mask the model passes (on CUDA flash takes no mask:
    BERT's padding and block-diagonal masks go to memory-efficient or cuDNN); here on a CPU, the model's training
    forward is watched to run the kernel named."""
    cfg = C.load(preset, ["data.path=none", "model.vocab_size=100", *overrides])
    assert f"; attention {attention}; " in K.describe(cfg, "eager", False, Lamb([torch.zeros(1)]), torch.device("cpu"))
    if preset == "bert-tiny" and not overrides:  # UniLM's model attends under a span per token, flash takes none
        unilm = C.load("unilm-tiny", ["data.path=none", "model.vocab_size=100"])
        assert "; attention torch SDPA math (per-token span mask); " in K.describe(
            unilm, "eager", False, Lamb([torch.zeros(1)]), torch.device("cpu"),
            objectives.get(unilm.data.objective).attention_mask)
    mcore.initialize(tp=1, seed=0)
    model, ids = models.build(cfg.model).train(), torch.ones(2, cfg.data.seq_len, dtype=torch.long)
    with Ops() as ops:
        if cfg.model.causal:
            model(ids)
        else:
            unpadded = {"sample_index": ids} if cfg.data.unpadded else {}  # (XLNet's model takes no unpadded rows)
            model(ids, torch.ones_like(ids), torch.zeros_like(ids), **unpadded)
    ran = {"flash": "aten._scaled_dot_product_flash_attention_for_cpu.default", "math": "aten._safe_softmax.default"}
    assert {name for name, op in ran.items() if ops.seen[op]} == {name for name in ran if f"SDPA {name}" in attention}
