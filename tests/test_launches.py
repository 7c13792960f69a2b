"""Kernel launches per step (pretrain/launches.py), the host term of `ptm plan` (issue 39): counted on a real
Trainer step of the config narrowed to a tiny width, the same at any width, growing with the layers by the per-layer
count the estimate uses, on the kernels a GPU runs (SDPA's fused attention, multi-tensor optimizer loops)."""
import re

import pytest

from conftest import run_cli
from pretrain import cost, hardware, launches, speed
from pretrain.config import load

pytestmark = pytest.mark.distributed  # (Trainers: a process group of one)


def _cfg(train_data, *more):
    return load("bert-tiny", [f"data.path={train_data}", "data.seq_len=32", "model.max_position_embeddings=32",
                              "data.valid_fraction=0.02", "precision=bf16", *more])


@pytest.fixture(scope="module")
def counted(train_data):
    """bert-tiny (2 layers) at head widths 8 and 16, and with 4 layers."""
    return {"narrow": launches.count(_cfg(train_data)), "wider": launches.count(_cfg(train_data), width=16),
            "deeper": launches.count(_cfg(train_data, "model.num_layers=4"))}


def test_launches_do_not_depend_on_the_width_and_run_the_gpus_kernels(counted):
    (narrow, seen), (wider, _) = counted["narrow"], counted["wider"]
    assert narrow == wider
    first, second, third, end = seen.marks
    assert second - first == narrow.per_micro_batch and end == narrow.of(launches.ACCUMULATION)
    assert third - second >= narrow.per_micro_batch  # the last micro-batch: the accumulation boundary's work too
    ops = seen.ops
    assert ops["_scaled_dot_product_flash_attention_for_cpu"] == 2 * 3  # a fused kernel per layer, as on a GPU
    assert ops["_fused_adamw_"] == 2  # torch's fused AdamW: one kernel per parameter group (decay, no decay)
    assert not [op for op in ops if op in launches.NO_LAUNCH or op in ("view", "t", "transpose", "expand")]


def test_launches_grow_with_the_layers_as_the_estimate_says(counted):
    """Two more layers add two layers' launches to each further micro-batch: `cost.estimate_launches`'s constants
    are what a BERT layer and its heads launch."""
    narrow, deeper = counted["narrow"][0], counted["deeper"][0]
    assert (deeper.per_micro_batch - narrow.per_micro_batch) / 2 == cost.LAYER_LAUNCHES
    assert deeper.optimizer == narrow.optimizer  # multi-tensor loops: the step's end does not grow with the depth
    assert cost.estimate_launches(_cfg("unused")) == narrow
    assert cost.estimate_launches(_cfg("unused", "model.num_layers=4")) == deeper


def test_plan_prices_the_counted_launches_and_calibrate_measures_the_host(train_data, counted):
    sets = [f"data.path={train_data}", "data.seq_len=32", "model.max_position_embeddings=32",
            "data.valid_fraction=0.02", "precision=bf16", "train.global_batch_size=64", "train.micro_batch_size=8"]
    out = run_cli("pretrain", "plan", "--config", "bert-tiny", "--gpu", "h200", "--gpus", "4", "--count-launches",
                  "--launch-us", "40", "--set", *sets).stdout
    host = next(x for x in out.splitlines() if x.strip().startswith("host (kernel launches)"))
    launched = counted["narrow"][0].of(2)  # 64 = 8 x 4 GPUs x 2 micro-batches
    assert f"{launched:,} launches (counted) x 40 us" in host and f"{launched * 40e-3:.1f} ms" in host
    step = next(x for x in out.splitlines() if x.strip().startswith("step "))
    assert "bound by the host" in step  # a tiny model's kernels take no time on an H200
    cfg = load("bert-tiny", [*sets, "model.vocab_size=3000"])
    assert speed.predict(cfg, hardware.gpu("h200"), 4).launches == cost.estimate_launches(cfg).of(2)
    calibrated = run_cli("pretrain", "plan", "--config", "bert-tiny", "--calibrate", "--set", *sets,
                         "model.vocab_size=30522").stdout  # (bert-base's: narrowed steps take the dataset's)
    assert f"{counted['narrow'][0].of(launches.ACCUMULATION):,} kernel launches a step" in calibrated
    assert "on cpu" in calibrated and float(re.search(r"--launch-us ([\d.e+-]+)", calibrated).group(1)) > 0
    assert "note: measured without a GPU" in calibrated


def test_t5s_biased_attention_and_rms_norm_count_as_the_one_kernel_a_gpu_runs(t5_data):
    """A CPU runs SDPA with T5's learned position bias on its math path and decomposes RMSNorm (pow, mean, rsqrt,
    products, each with a backward); a GPU runs one kernel each way for both: counted so."""
    cfg = load("t5-tiny", [f"data.path={t5_data}", "data.seq_len=32", "data.valid_fraction=0.02"])
    m = cfg.model
    _, seen = launches.count(cfg)
    norms = 2 * m.num_layers + 3 * m.decoder_layers + 2  # a block's per sublayer, each stack's final one
    biased = m.num_layers + m.decoder_layers  # the self-attentions (the cross-attentions have no bias)
    ops = seen.ops
    assert ops["rms_norm"] == ops["rms_norm_backward"] == norms * launches.ACCUMULATION
    assert ops["scaled_dot_product_attention"] == ops["scaled_dot_product_attention_backward"] == \
        biased * launches.ACCUMULATION
    assert not [op for op in ("rsqrt", "mean", "_safe_softmax", "bmm") if ops[op]], ops  # (pow: the clipping norm)


def test_the_blocks_run_nothing_a_cuda_graph_capture_refuses(counted, monkeypatch):
    """The blocks' forward and backward passes (the region a CUDA graph would capture) dispatch no host sync, no op of
    data-dependent size and no host-device copy in a real step; a block that reads a value on the host and indexes by
    a boolean mask is caught, in its forward pass and its backward pass, and the same ops outside the blocks are not."""
    import torch

    from pretrain import models
    from pretrain.models import layers
    from pretrain.parallel import mcore

    assert not counted["narrow"][1].unsafe and not counted["deeper"][1].unsafe
    forward = layers.MLP.forward

    def syncing(self, x):
        x.sum().item()
        return forward(self, x[x.isfinite()].view_as(x))

    monkeypatch.setattr(layers.MLP, "forward", syncing)
    mcore.initialize(1, 0)
    model = models.build(load("bert-tiny", ["model.vocab_size=100"]).model, tp=mcore.OneRank())
    counter = launches.KernelLaunches()
    counter.on = True
    hooks = launches.watch_blocks(model, counter)
    with counter:
        ids = torch.randint(0, 100, (2, 8))
        hidden = model.encode(ids)
        hidden[hidden.isfinite()].sum().backward()  # outside the blocks: not counted
        ids.sum().item()
    for hook in hooks:
        hook.remove()
    assert counter.unsafe == {"_local_scalar_dense": 2, "index": 2, "index_put": 2}  # 2 layers: forward, backward
    assert counter.in_blocks == 0


def test_elmos_lstm_steps_launch_as_its_estimate_says(words_data):
    """ELMo is no transformer: its LSTMs step word by word, so its launches grow with the window, the layers, the
    character filters and the highways as its family's estimate says (fitted on other sizes than this one's)."""
    cfg = load("elmo-tiny", [f"data.path={words_data}", "data.seq_len=6", "model.highway_layers=2",
                             "model.char_filters=[[1, 16], [2, 16], [3, 32]]"])
    assert launches.count(cfg)[0] == cost.estimate_launches(cfg)
