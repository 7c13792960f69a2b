"""GPT-3's locally banded attention (model.attention_layers, attention_window): the band against a float64 reference,
per layer as the list says, and counted by `ptm plan`. Its HF export and import: tests/test_hf_interop.py; its layouts:
tests/test_fidelity.py."""
import math

import pytest
import torch

from pretrain import cost
from pretrain.config import ConfigError, load
from pretrain.models.config import ModelConfig
from pretrain.models.layers import Context, DotProductAttention, LocalAttention
from pretrain.parallel import mcore


def reference(q, k, v, window: int, causal: bool, keep=None):
    """softmax(q k^T / sqrt(d)) v in float64, each query over the keys of its band (the queries are the last of the
    keys' positions), one (query, key) pair at a time; `keep` [b, t]: keys that are not padding."""
    b, heads, s, d = q.shape
    t = k.shape[2]
    out = torch.zeros(b, heads, s, d, dtype=torch.float64)
    for i in range(s):
        at = t - s + i
        keys = [j for j in range(t) if (0 <= at - j < window if causal else abs(at - j) < window)]
        for n in range(b):
            seen = [j for j in keys if keep is None or keep[n, j]]
            scores = torch.stack([(q[n, :, i] * k[n, :, j]).sum(-1) for j in seen], -1) / math.sqrt(d)
            out[n, :, i] = (scores.softmax(-1)[..., None] * v[n][:, seen]).sum(-2)
    return out


@pytest.mark.parametrize("causal, queries", [(True, 12), (True, 3), (False, 12)])
def test_the_local_core_attends_to_its_band_alone(causal, queries):
    """Causal: query i sees keys i - window < j <= i, also for queries that are the last few of the keys (incremental
    decoding); bidirectional: |i - j| < window, under a padding mask too. A window as long as the sequence is the
    global core."""
    torch.manual_seed(0)
    cfg = ModelConfig(arch="gpt3", hidden_size=16, num_heads=2, attention_window=4, causal=causal)
    core = LocalAttention(Context.of(cfg, mcore.OneRank()), 8)
    q = torch.randn(2, 2, queries, 8, dtype=torch.float64)
    k, v = torch.randn(2, 2, 12, 8, dtype=torch.float64), torch.randn(2, 2, 12, 8, dtype=torch.float64)
    keep = None if causal else torch.arange(12) < torch.tensor([[12], [9]])
    mask = None if keep is None else keep[:, None, None, :]
    torch.testing.assert_close(core(q, k, v, mask, 0.0), reference(q, k, v, 4, causal, keep), rtol=1e-12, atol=1e-12)
    if queries == 12:
        cfg.attention_window = 12
        wide = LocalAttention(Context.of(cfg, mcore.OneRank()), 8)
        dense = DotProductAttention(Context.of(cfg, mcore.OneRank()), 8)
        torch.testing.assert_close(wide(q, k, v, mask, 0.0), dense(q, k, v, mask, 0.0), rtol=1e-12, atol=1e-12)


def test_each_layer_takes_its_attention_from_the_repeated_list():
    from pretrain.models.model import Pretraining

    cfg = ModelConfig(arch="gpt3", vocab_size=64, hidden_size=16, num_heads=2, num_layers=5, ffn_hidden_size=32,
                      type_vocab_size=0, attention_layers=["local", "global", "global"])
    kinds = [type(b.attn.core).__name__ for b in Pretraining(cfg, tp=mcore.OneRank()).blocks]
    assert kinds == ["LocalAttention", "DotProductAttention", "DotProductAttention", "LocalAttention",
                     "DotProductAttention"]
    assert not any(b.attn.qkv.bias is not None for b in Pretraining(cfg, tp=mcore.OneRank()).blocks)  # GPT-Neo's


def test_plan_counts_each_local_layer_over_its_band():
    """`ptm plan`'s FLOPs of GPT-3 175B: each local layer's scores and weighted sum run over 2048 x 256 (query, key)
    pairs where a dense layer's run over 2048 x 2048: 12 * a * s * (s - w) less per local layer, nothing else
    changes; the parameters are the paper's 175B (GPT-Neo's layout: no q, k, v biases)."""
    cfg = load("gpt3-175b")
    m, s = cfg.model, cfg.data.seq_len
    dense = load("gpt3-175b", ["model.attention_layers=[global]"])
    local_layers = sum(m.attention(i) == "local" for i in range(m.num_layers))
    assert local_layers == 48 and m.attention_window == 256 and s == 2048
    saved = cost.flops_per_sample(dense) - cost.flops_per_sample(cfg)
    assert saved == local_layers * 12 * m.attention_width * s * (s - m.attention_window)
    assert 174e9 < cost.count_parameters(m) < 175e9


def test_local_layers_need_a_core_that_takes_a_mask_and_unshared_attention():
    with pytest.raises(ConfigError, match="model.attention_layers=\\[global, local\\] has local layers, which "
                                          "model.arch=nezha"):
        load("nezha-tiny", ["model.attention_layers=[global,local]"]).validate()
    with pytest.raises(ConfigError, match="model.share_layers=all shares one attention"):
        load("albert-tiny", ["model.attention_layers=[global,local]"]).validate()
    with pytest.raises(ConfigError, match="model.attention_layers=\\[dense\\] is not a list of global | local"):
        load("gpt3-tiny", ["model.attention_layers=[dense]"]).validate()


def test_the_speed_model_times_the_masked_square_that_local_layers_still_compute():
    """On GPUs a local layer is SDPA under a band mask: it computes the whole s x s square and discards what lies
    outside the band. So the predicted device time of GPT-3 Small (and of XL, whose recomputed forwards do so again)
    matches the dense model's (the same kernels' work) while its model FLOPs, and so its MFU, are lower."""
    from pretrain import hardware, speed

    hw = hardware.gpu("h100")
    local = speed.predict(load("gpt3-small", ["train.micro_batch_size=4"]), hw, 64)
    dense = speed.predict(load("gpt3-small", ["train.micro_batch_size=4", "model.attention_layers=[global]"]), hw, 64)
    assert local.compute == pytest.approx(dense.compute, rel=1e-12)
    assert local.flops_per_sample < 0.9 * dense.flops_per_sample and local.mfu < 0.9 * dense.mfu
    xl = [speed.predict(load("gpt3-xl", ["train.micro_batch_size=2", *more]), hw, 64).compute
          for more in ((), ("model.attention_layers=[global]",))]
    assert xl[0] == pytest.approx(xl[1], rel=1e-12)
