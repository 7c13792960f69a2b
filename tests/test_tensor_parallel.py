"""The model under tensor parallelism (TP=2, two gloo processes) equals the one-process model: same
initial weights once the shards are merged, same logits, same loss, same gradients."""
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, free_port
from pretrain import models
from pretrain.checkpoint import split_dim
from pretrain.models.model import Pretraining
from pretrain.parallel import mcore
from tp_worker import step, tiny


@pytest.mark.distributed
@pytest.mark.parametrize("arch", ["bert", "gpt2", "xlnet"])
def test_tp2_matches_one_process(arch, tmp_path):
    """XLNet: its per-head parameters (u, v, s, the segment vectors) split by heads, its query stream and memory."""
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "tests"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(free_port()), os.path.join(ROOT, "tests", "tp_worker.py"), arch, "2", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shards = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]

    mcore.initialize(tp=1, seed=0)
    ref = models.build(tiny(arch))
    ref_logits, ref_loss = step(ref, arch)

    dims = {name: split_dim(p) for name, p in ref.named_parameters()}

    def merged(part, key):
        dim = dims.get(key)
        return shards[0][part][key] if dim is None else torch.cat([s[part][key] for s in shards], dim)

    for key, value in ref.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(merged("state", key), value), key  # initialisation is TP-size independent
    torch.testing.assert_close(torch.cat([s["logits"] for s in shards], -1), ref_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(shards[0]["loss"], ref_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(shards[1]["loss"], ref_loss, rtol=1e-6, atol=1e-6)
    for name, p in ref.named_parameters():
        torch.testing.assert_close(merged("grads", name), p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_activation_checkpointing_gives_the_same_gradients_with_dropout():
    """Recomputation replays the dropout masks (default generator and the TP tracker), so checkpointed
    layers give bit-identical loss and gradients."""
    import dataclasses

    results = []
    for checkpointing in (False, True):
        mcore.initialize(tp=1, seed=0)
        cfg = dataclasses.replace(tiny("bert"), hidden_dropout=0.2, attention_dropout=0.2,
                                  activation_checkpointing=checkpointing)
        model = Pretraining(cfg).train()
        _, loss = step(model, "bert")
        results.append((loss, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert torch.equal(loss_a, loss_b)
    assert all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)
