"""Kernel choices against their references on CPU: compiled transformer blocks (torch.compile, Inductor) against
eager ones, liger-kernel's fused linear cross-entropy (Triton, interpreted: TRITON_INTERPRET=1 from conftest)
against logits + megatron-core's cross-entropy, and the choice per device."""
import dataclasses

import pytest
import torch

from pretrain import config as C
from pretrain import kernels as K
from pretrain.models.model import Pretraining
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


def test_compiled_blocks_replay_dropout_under_activation_checkpointing():
    """Recomputing a compiled block draws the same dropout masks: checkpointed and plain runs are bit-identical."""
    torch._dynamo.reset()
    cfg = dataclasses.replace(tiny("bert"), hidden_dropout=0.2, attention_dropout=0.2)
    plain = run(cfg, True)
    checkpointed = run(dataclasses.replace(cfg, activation_checkpointing=True), True)
    assert torch.equal(plain[2], checkpointed[2])
    assert all(torch.equal(plain[3][n], checkpointed[3][n]) for n in plain[3])
    assert not torch.equal(plain[2], run(dataclasses.replace(cfg, hidden_dropout=0.0), True)[2])  # dropout was on


def test_auto_compiles_on_cuda_under_zero_0_and_1_only():
    def kernels(setting, cuda, stage):
        return C.load("bert-tiny", [f"kernels={setting}", f"zero.stage={stage}"]).kernels_on(cuda)

    assert kernels("auto", False, 1) == "eager"
    assert [kernels("auto", True, stage) for stage in range(4)] == ["compile", "compile", "eager", "eager"]
    assert kernels("compile", False, 0) == "compile"


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


def test_fused_linear_cross_entropy_matches_logits_and_cross_entropy():
    pytest.importorskip("liger_kernel")
    assert K.fused_lm_loss_available(torch.device("cpu")) is None
    mcore.initialize(tp=1, seed=0)
    x, weight, bias, labels, vocab = fused_case()
    results = []
    for fused in (True, False):
        leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
        if fused:
            loss, correct = K.linear_cross_entropy(*leaves, labels, vocab)
        else:
            logits = (leaves[0] @ leaves[1].T + leaves[2]).masked_fill(torch.arange(128) >= vocab, -1e30)
            loss = K.cross_entropy(logits, labels).sum()
            correct = ((logits.argmax(-1) == labels) & (labels != -100)).sum()
        loss.backward()
        results.append((loss.detach(), int(correct), [t.grad for t in leaves]))
    (fused_loss, fused_correct, fused_grads), (loss, correct, grads) = results
    torch.testing.assert_close(fused_loss, loss, rtol=1e-5, atol=1e-5)
    assert fused_correct == correct > 0
    for got, want in zip(fused_grads, grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert fused_grads[1][vocab:].abs().sum() == 0  # the padding rows are out of the softmax


def test_fused_lm_loss_is_refused_where_it_cannot_apply(tmp_path):
    cfg = C.load("bert-tiny", [f"data.path={tmp_path}", "fused_lm_loss=on", "parallel.tp=2"])
    with pytest.raises(C.ConfigError, match="fused_lm_loss=on needs the whole vocabulary on one rank"):
        cfg.validate()
