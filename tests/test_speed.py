"""`ptm plan --gpu`: the speed model against published training results (bench/anchors.yaml), its terms against
the formulas docs/performance.md states, the command line (`--gpu`, `--nodes`, `--interconnect`, `--compare`,
`--check` on a real run)."""
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys

import pytest
import torch
import yaml

from conftest import ROOT, run_cli
from pretrain import hardware, speed
from pretrain.config import ConfigError, load

sys.path.insert(0, os.path.join(ROOT, "bench"))
import speed_model  # noqa: E402

ANCHORS = speed_model.anchors()


@pytest.mark.parametrize("anchor", ANCHORS, ids=[a["name"] for a in ANCHORS])
def test_published_results_within_tolerance(anchor):
    """Held anchors agree within their tolerance; an anchor marked not held really disagrees (and says why), so
    the list stays honest when the model changes."""
    predicted, published, ok = speed_model.evaluate(anchor)
    assert anchor["source"] and "tolerance" not in anchor  # one tolerance for all: speed_model.TOLERANCE
    if anchor.get("held", True):
        assert ok, f"{anchor['name']}: predicted {predicted:.4g}, published {published:.4g}"
    else:
        assert not ok and anchor["why"], f"{anchor['name']} agrees now ({predicted:.4g} vs {published:.4g}): hold it"


@pytest.mark.parametrize("anchor", ANCHORS, ids=[a["name"] for a in ANCHORS])
def test_every_published_layout_fits_the_memory_it_ran_in(anchor):
    """`ptm plan` accepts each published run's layout on its GPU: it counts the activations ptm's kernels keep (flash
    or memory-efficient attention keeps no s x s probabilities, the fused LM loss no whole logits), so `--compare`
    does not reject layouts that ran (MosaicML's 125M-1B at micro batches 8-26 of 2048 tokens on 40 GB)."""
    used, gpu = speed_model.memory(anchor)
    assert used <= gpu, f"{anchor['name']}: ptm plan counts {used:.1f} GiB on a {gpu:g} GiB GPU"


@pytest.mark.parametrize("zeroed, at_least", [("_ring", 8), ("_data_parallel", 4)],
                         ids=["every collective", "data-parallel and ZeRO only"])
def test_the_anchors_constrain_communication(monkeypatch, zeroed, at_least):
    """A model whose communication is free (every collective, or only the data-parallel / ZeRO ones) fails at least
    `at_least` held anchors: multi-node data parallelism, ZeRO-3 across nodes and tensor parallelism are checked by
    published results, not assumed."""
    monkeypatch.setattr(speed, zeroed, lambda *args, **kwargs: 0.0 if zeroed == "_ring" else (0.0, 0.0))
    failed = [a["name"] for a in ANCHORS if a.get("held", True) and not speed_model.evaluate(a)[2]]
    assert len(failed) >= at_least, failed


def _scaling_points(anchor) -> float:
    predicted, published, _ = speed_model.evaluate(anchor)
    return abs(100 * (predicted - published))


@pytest.mark.parametrize("term", ["tp_comm", "dp_comm", "memory", "optimizer", "zero3_latency"])
def test_every_term_of_the_step_is_constrained_by_an_anchor(monkeypatch, term):
    """Tensor-parallel communication, data-parallel / ZeRO communication, memory-bound kernels, the optimizer's
    HBM traffic and the ring latency of ZeRO-3's per-layer collectives: a model without any one of them, each
    architecture's matmul efficiency fitted again to its calibration anchor (so it may absorb the term there), puts
    at least one held-out anchor out of tolerance, or a held-out scaling anchor within the issue's 5 points out of
    them."""
    from dataclasses import replace

    scaling = [a for a in ANCHORS if a.get("held", True) and "scaling" in a["published"]]
    within = {a["name"] for a in scaling if _scaling_points(a) <= speed_model.SCALING_POINTS}
    predict, fitted = speed.predict, {}

    def without(cfg, hw, world, eff=hardware.Efficiency(), **kwargs):
        eff = replace(eff, matmul=eff.matmul or fitted.get(hw.generation))
        return replace(predict(cfg, hw, world, eff, **kwargs), **{term: 0.0})

    monkeypatch.setattr(speed, "predict", without)
    for a in ANCHORS:
        if a.get("calibration"):
            fitted[hardware.gpu(a["gpu"]).generation] = speed_model.fit(a)
    failed = [a["name"] for a in ANCHORS if a.get("held", True) and not a.get("calibration")
              and not speed_model.evaluate(a)[2]]
    failed += [a["name"] for a in scaling if a["name"] in within and _scaling_points(a) > speed_model.SCALING_POINTS]
    assert failed, f"no anchor constrains {term} (matmul refitted to {fitted})"


def test_zero3_waits_the_latency_of_its_per_layer_collectives():
    """ZeRO-3 gathers each layer's weights and reduce-scatters its gradients in collectives of their own: besides
    the bytes (one buffer, one latency, in dp_comm), a micro batch waits the ring latency of every other one, exposed;
    none below ZeRO-3 or inside one rank."""
    hw, eff = hardware.gpu("a100-40gb", "8x200gbe"), hardware.Efficiency()
    cfg = load("gpt2", ["model.hidden_size=1024", "model.num_layers=24", "model.num_heads=16",
                        "model.ffn_hidden_size=4096", "data.seq_len=2048", "model.max_position_embeddings=2048",
                        "precision=bf16", "zero.stage=3", "train.micro_batch_size=18", "train.global_batch_size=4608"])
    p = speed.predict(cfg, hw, 128)  # 2 micro batches, all 24 layers' weights kept for the backward (reuse distance)
    gathers = speed._zero3_gathers(cfg) * 24
    assert gathers == 24
    ring = speed._ring("all-gather", 0.0, 128, 8, hw, eff)
    assert ring == pytest.approx((128 - 16) * 5e-6 + 16 * 20e-6)  # intra-node steps over NVLink, 16 over the network
    assert p.zero3_latency == pytest.approx(2 * ((gathers - 1) * ring + 23 * ring))
    assert p.parts()["data-parallel / ZeRO communication"] == pytest.approx(p.dp_comm + p.zero3_latency)
    assert p.step == pytest.approx(sum(p.parts().values()))
    zero2 = load("gpt2", ["precision=bf16", "zero.stage=2", "train.micro_batch_size=1", "train.global_batch_size=128"])
    assert speed.predict(zero2, hw, 128).zero3_latency == 0
    assert speed.predict(cfg, hw, 1).zero3_latency == 0


def test_each_architectures_matmul_efficiency_is_fitted_to_one_anchor():
    """configs/hardware/gpus.yaml's matmul efficiency per architecture is what its one calibration anchor gives; the
    other anchors are held out."""
    generations = hardware._catalog()["generations"]
    calibration = {hardware.gpu(a["gpu"]).generation: a for a in ANCHORS if a.get("calibration")}
    assert len(calibration) == sum(bool(a.get("calibration")) for a in ANCHORS) == len(generations)  # one each
    for name, a in calibration.items():
        assert generations[name]["fitted_to"] == a["name"]
        assert abs(speed_model.fit(a) - generations[name]["matmul"]) < 5e-4, name
    others = [a for a in ANCHORS if not a.get("calibration") and a.get("held", True)]
    assert len(others) >= 30 and {a["gpu"] for a in others} >= {"a100-80gb", "a100-40gb", "v100-32gb", "v100-dgx2"}


def test_ring_collectives():
    """all-reduce = 2(n-1)/n of the bytes, reduce-scatter / all-gather (n-1)/n, over NVLink inside a node and
    min(NVLink, the node's NICs / tp) across nodes, at Efficiency.link, plus a latency per ring step."""
    hw, eff, gb = hardware.gpu("a100-80gb", "8xhdr"), hardware.Efficiency(), 1e9
    inside = speed._ring("all-reduce", gb, 8, 8, hw, eff)
    assert inside == pytest.approx(2 * 7 / 8 * gb / (300e9 * 0.8) + 2 * 8 * 5e-6)
    across = speed._ring("all-reduce", gb, 16, 8, hw, eff)
    assert across == pytest.approx(2 * 15 / 16 * gb / (200e9 * 0.8) + 2 * (14 * 5e-6 + 2 * 10e-6))
    shared = speed._ring("reduce-scatter", gb, 8, 2, hw, eff, tp=4)  # 4 TP groups share the NICs
    assert shared == pytest.approx(7 / 8 * gb / (50e9 * 0.8) + (4 * 5e-6 + 4 * 10e-6))
    assert speed._ring("all-gather", gb, 1, 8, hw, eff) == 0
    assert hardware.gpu("a100-80gb", "4x100").network.bandwidth == 50e9


def _bert(*sets):
    return load("bert-large", ["precision=bf16", "data.seq_len=128", "data.max_predictions_per_seq=20",
                               "train.micro_batch_size=32", "zero.stage=1", *sets])


def test_step_terms_per_zero_stage_and_tensor_parallelism(tmp_path):
    """The communication each layout adds, term by term (docs/performance.md), as DeepSpeed 0.19.8 runs it: ZeRO-0
    all-reduces the gradients once per step; ZeRO-1 all-reduces them (BF16_Optimizer whole, DeepSpeed's ZeRO
    optimizer bucket by bucket) and all-gathers the updated weights; ZeRO-2 all-reduces every micro batch and
    gathers the weights once; ZeRO-3 reduce-scatters every micro batch and gathers the weights for the forward and
    again for the backward, except the top layers kept within stage3_max_reuse_distance (all of BERT-large), behind
    the compute; TP all-reduces 4 times per layer and micro batch (6 with recomputation), plus the embeddings'
    forward and the head's backward."""
    from pretrain.cost import count_parameters

    hw, eff = hardware.gpu("a100-80gb"), hardware.Efficiency()
    world, per_node = 32, 8
    n = count_parameters(_bert().model)
    grads, weights = 4 * n, 2 * n  # bf16 weights, gradients reduced in fp32 (grad_accum_dtype=fp32)

    def p(stage, accumulation, *sets):
        return speed.predict(_bert(f"zero.stage={stage}", f"train.global_batch_size={32 * 32 * accumulation}", *sets),
                             hw, world)

    def ring(kind, nbytes, ranks=32):
        return speed._ring(kind, nbytes, ranks, per_node, hw, eff)

    bf16_accumulation = "grad_accum_dtype=bf16"
    assert p(0, 2, bf16_accumulation).dp_comm == p(0, 8, bf16_accumulation).dp_comm == pytest.approx(
        ring("all-reduce", 2 * n))
    assert p(1, 2).dp_comm == p(1, 8).dp_comm == pytest.approx(ring("all-reduce", grads) + ring("all-gather", weights))
    assert p(1, 2, bf16_accumulation).dp_comm == pytest.approx(ring("all-reduce", 2 * n) + ring("all-gather", weights))
    assert p(2, 2).dp_comm == pytest.approx(2 * ring("all-reduce", grads) + ring("all-gather", weights))
    assert p(2, 8).dp_comm - p(2, 2).dp_comm == pytest.approx(6 * ring("all-reduce", grads))
    z3 = p(3, 4)
    gathered = 4 * (ring("all-gather", weights) + ring("reduce-scatter", grads))
    assert z3.dp_comm == 0 and z3.dp_comm_hidden == pytest.approx(gathered)
    assert p(3, 4, "model.activation_checkpointing=true").dp_comm_hidden == pytest.approx(gathered)
    near = tmp_path / "ds.json"  # 10M: within a layer (12.6M parameters), so only the top one is gathered once
    near.write_text(json.dumps({"zero_optimization": {"stage3_max_reuse_distance": 10 ** 7}}))
    for sets, gathers in (([], 2 - 1 / 24), (["model.activation_checkpointing=true"], 3 - 1 / 24)):
        q = p(3, 4, f"deepspeed_config={near}", *sets)
        assert q.dp_comm + q.dp_comm_hidden == pytest.approx(
            4 * (ring("all-gather", gathers * weights) + ring("reduce-scatter", grads)))
    assert p(0, 2, bf16_accumulation).optimizer == pytest.approx(32 * p(1, 2).optimizer)
    per_param = 116 + 16  # ptm's LAMB passes, DeepSpeed's mixed-precision copies
    assert p(1, 2).optimizer == pytest.approx(n // 32 * per_param / (2039e9 * 0.8))
    # ZeRO-Offload: the node's 8 partitions stream through its host memory, gradients and weights cross PCIe
    assert p(1, 2, "zero.offload=true").optimizer == pytest.approx(
        n // 32 * per_param * 8 / (400e9 * 0.8) + n // 32 * (4 + 2) / (32e9 * 0.8))

    tp2 = speed.predict(_bert("parallel.tp=2", f"train.global_batch_size={32 * 16}"), hw, world)
    tp1 = speed.predict(_bert(f"train.global_batch_size={32 * 32}"), hw, world)
    activations = 32 * 128 * 1024 * 2
    assert tp2.tp_comm == pytest.approx((4 * 24 + 2) * speed._ring("all-reduce", activations, 2, 2, hw, eff))
    shapes = [speed.gemm_shape(_bert(*sets)) for sets in ([f"train.global_batch_size={32 * 32}"],
                                                          ["parallel.tp=2", f"train.global_batch_size={32 * 16}"])]
    assert shapes[1] < shapes[0]  # each rank's GEMMs are half as wide: further below the peak
    assert tp1.tp_comm == 0 and tp2.compute == pytest.approx(tp1.compute / 2 * shapes[0] / shapes[1])
    ckpt = speed.predict(_bert("parallel.tp=2", f"train.global_batch_size={32 * 16}",
                               "model.activation_checkpointing=true"), hw, world)
    assert ckpt.tp_comm == pytest.approx((6 * 24 + 2) * speed._ring("all-reduce", activations, 2, 2, hw, eff))
    assert ckpt.compute > tp2.compute and ckpt.mfu < tp2.mfu  # recomputation is not model FLOPs


def test_gemm_shapes_set_the_matmul_rate():
    """Each GEMM of M x N x K runs at g(M) g(N) g(K) of a large one's rate, g(x) = x / (x + 128), attention's at
    ATTENTION_RATE; the micro batch's rate is their FLOP-weighted harmonic mean (docs/performance.md): a wide model
    nears the fitted efficiency, a narrow one or one split over many TP ranks stays further below it."""
    def g(x):
        return x / (x + 128)

    cfg = _bert("data.seq_len=128", "train.micro_batch_size=8")
    h, f, L, s, b, v, p = 1024, 4096, 24, 128, 8, 30592, 20
    m = b * s
    work = [(L * m * n * k, g(m) * g(n) * g(k)) for n, k in ((3 * h, h), (h, h), (f, h), (h, f))]
    work += [(L * b * 2 * h * s * s, speed.ATTENTION_RATE), (b * p * v * h, g(b * p) * g(v) * g(h))]
    assert speed.gemm_shape(cfg) == pytest.approx(sum(w for w, _ in work) / sum(w / r for w, r in work))
    micro = "train.micro_batch_size=8"
    wide = load("gpt2", [micro, "model.hidden_size=8192", "model.num_heads=64", "model.ffn_hidden_size=32768"])
    assert speed.gemm_shape(load("gpt2", [micro])) < speed.gemm_shape(wide)
    assert speed.gemm_shape(load("gpt2", [micro, "parallel.tp=8"])) < speed.gemm_shape(load("gpt2", [micro]))


def test_overlap_follows_deepspeeds_overlap_comm(tmp_path):
    """ZeRO-3 overlaps by default; a deepspeed_config with overlap_comm hides ZeRO-1's gradient reduction behind the
    last backward and ZeRO-2's behind each backward; without it they are exposed, and so is BF16_Optimizer's all-reduce
    (it reduces after the backward pass whatever overlap_comm says)."""
    hw = hardware.gpu("a100-80gb")
    user = tmp_path / "ds.json"
    user.write_text(json.dumps({"zero_optimization": {"overlap_comm": True}}))
    for stage in (1, 2):
        plain = speed.predict(_bert(f"zero.stage={stage}", "train.global_batch_size=4096", "grad_accum_dtype=bf16"),
                              hw, 32)
        overlapped = speed.predict(_bert(f"zero.stage={stage}", "train.global_batch_size=4096", "grad_accum_dtype=bf16",
                                         f"deepspeed_config={user}"), hw, 32)
        assert plain.dp_comm_hidden == 0 and overlapped.dp_comm < plain.dp_comm
        assert overlapped.dp_comm + overlapped.dp_comm_hidden == pytest.approx(plain.dp_comm)
    bf16_optimizer = speed.predict(_bert("train.global_batch_size=4096", f"deepspeed_config={user}"), hw, 32)
    assert bf16_optimizer.dp_comm_hidden == 0
    assert bf16_optimizer.dp_comm == speed.predict(_bert("train.global_batch_size=4096"), hw, 32).dp_comm
    z3 = _bert("zero.stage=3", "train.global_batch_size=4096")
    assert speed.predict(z3, hw, 32).dp_comm_hidden > 0
    assert speed.predict(z3, hw, 32, overlap_reduce=False).dp_comm_hidden == 0


@pytest.mark.parametrize("precision, accumulation, grad, weight", [("fp32", "fp32", 4, 4), ("fp16", "fp32", 2, 2),
                                                                   ("bf16", "bf16", 2, 2), ("bf16", "fp32", 4, 2)])
def test_gradients_travel_in_deepspeeds_communication_dtype(tmp_path, precision, accumulation, grad, weight):
    """Every DeepSpeed stage casts the gradients to its communication_data_type before reducing them (default: the
    model's dtype), and pretrain/engine.py sets it to fp32 for bf16 with grad_accum_dtype=fp32: the speed model counts
    `grad` bytes per gradient and `weight` bytes per gathered weight (ZeRO-2: an all-reduce per micro batch, an
    all-gather per step), as the DeepSpeed config ptm builds says; a deepspeed_config's own choice counts too."""
    from pretrain.engine import ds_config
    from pretrain.cost import count_parameters

    hw, eff = hardware.gpu("a100-80gb"), hardware.Efficiency()
    sets = [f"precision={precision}", f"grad_accum_dtype={accumulation}", "train.global_batch_size=4096"]
    n = count_parameters(_bert().model)
    z2 = speed.predict(_bert("zero.stage=2", *sets), hw, 32)
    assert z2.dp_comm == pytest.approx(4 * speed._ring("all-reduce", grad * n, 32, 8, hw, eff)
                                       + speed._ring("all-gather", weight * n, 32, 8, hw, eff))
    for stage in range(4) if precision != "bf16" or accumulation == "bf16" else (1, 2, 3):
        cfg = _bert(f"zero.stage={stage}", *sets)
        sent = ds_config(cfg, 32).get("communication_data_type") or precision
        assert speed.reduce_bytes(cfg) == speed.GRAD_BYTES[sent] == grad, (stage, sent)
    if precision == "fp32":
        user = tmp_path / "ds.json"
        user.write_text(json.dumps({"communication_data_type": "BF16"}))
        assert speed.reduce_bytes(_bert(*sets, f"deepspeed_config={user}")) == 2


@pytest.mark.distributed
def test_collectives_are_what_deepspeed_sends(tmp_path):
    """The speed model's data-parallel collectives (kind and bytes per step) are what DeepSpeed sends under ptm's own
    DeepSpeed config, recorded on two gloo ranks (tests/comm_worker.py): gradients all-reduced in the communication
    dtype at ZeRO-0, under BF16_Optimizer and at ZeRO-1/2 (every micro batch at ZeRO-2), weights all-gathered after
    the step at ZeRO-1/2; at ZeRO-3 gradients reduce-scattered, weights gathered once per micro batch when reused
    within stage3_max_reuse_distance, twice when not."""
    import collections
    import subprocess

    from conftest import free_port

    on_demand = {"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0}  # every weight, no prefetch
    kept, released = tmp_path / "kept.json", tmp_path / "released.json"
    kept.write_text(json.dumps({"zero_optimization": on_demand}))
    released.write_text(json.dumps({"zero_optimization": {**on_demand, "stage3_max_reuse_distance": 0}}))
    base = ["bert-tiny", "train.micro_batch_size=2", "train.global_batch_size=8"]  # 2 micro batches on 2 ranks
    runs = {"zero0-fp32": [*base, "zero.stage=0"],
            "zero1-bf16-fp32": [*base, "zero.stage=1", "precision=bf16"],
            "zero1-bf16-bf16": [*base, "zero.stage=1", "precision=bf16", "grad_accum_dtype=bf16"],
            "zero2-bf16-fp32": [*base, "zero.stage=2", "precision=bf16"],
            "zero3-kept": [*base, "zero.stage=3", "precision=bf16", f"deepspeed_config={kept}"],
            "zero3-released": [*base, "zero.stage=3", "precision=bf16", f"deepspeed_config={released}"]}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           f"--master_port={free_port()}", os.path.join(ROOT, "tests", "comm_worker.py"), str(tmp_path),
                           json.dumps(runs)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-6000:]
    size = {"float32": 4, "bfloat16": 2, "float16": 2}
    for name, overrides in runs.items():
        got = json.loads((tmp_path / f"{name}.json").read_text())
        sent, predicted = collections.Counter(), collections.Counter()
        for key, elements in got["sent"].items():
            kind, dtype = key.split()
            sent[kind] += elements * size[dtype]
        for kind, nbytes, when in speed.collectives(load(overrides[0], overrides[1:]), got["n"]):
            predicted[kind] += nbytes * (got["accumulation"] if when == "micro" else 1)
        assert sent == predicted, name


def test_samples_mfu_and_time_follow_from_the_step():
    hw = hardware.gpu("h100")
    cfg = _bert("train.global_batch_size=1024", "train.steps=1000")
    p = speed.predict(cfg, hw, 16)
    from pretrain.cost import model_flops_per_sample, predicted_tokens

    assert p.device == pytest.approx(sum(p.parts().values()))
    assert p.launches == speed.estimate_launches(cfg).of(2)  # micro batch 32 x 2 per GPU
    assert p.host == p.launches * 65.6e-6  # hopper's launch_us
    assert p.step == max(p.device, p.host)
    assert p.samples_per_s == pytest.approx(1024 / p.step) and p.tokens_per_s == pytest.approx(128 * 1024 / p.step)
    flops = model_flops_per_sample(cfg.model, 128, predicted_tokens(cfg))
    assert p.mfu == pytest.approx(flops * p.samples_per_s / (16 * 989e12))
    device = p.flops_per_sample * 1024 / p.device / (16 * 989e12)
    assert 0.2 < device < 0.6  # a BERT-large step on H100s is neither idle nor above the calibrated matmul rate


def _numbers(line: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"-?[\d,]*\.?\d+", line)]


def test_plan_prints_the_step_throughput_time_and_scaling():
    out = run_cli("pretrain", "plan", "--config", "bert-large", "--gpu", "a100-80gb", "--nodes", "4",
                  "--set", "precision=bf16").stdout
    p = speed.predict(load("bert-large", ["precision=bf16"]), hardware.gpu("a100-80gb"), 32)
    assert "32 GPUs = tp 1 x dp 32" in out and "fits in 80 GiB" in out  # --gpu's memory, --nodes x 8 GPUs
    four = run_cli("pretrain", "plan", "--config", "bert-large", "--gpu", "a100-80gb", "--gpus", "16", "--nodes", "4",
                   "--set", "precision=bf16").stdout
    assert "16 x a100-80gb (4 nodes of 4;" in four  # --gpus over --nodes: 4 GPUs per node
    for part, seconds in p.parts().items():
        line = next(x for x in out.splitlines() if x.strip().startswith(part))
        assert _numbers(line.split(part)[1])[0] == pytest.approx(1e3 * seconds, abs=0.06)
    throughput = next(x for x in out.splitlines() if x.startswith("throughput:"))
    assert _numbers(throughput)[0] == pytest.approx(p.samples_per_s, abs=0.06)
    assert f"MFU {100 * p.mfu:.1f}%" in throughput
    assert f"time to train 62,500 steps: {62500 * p.step / 3600:,.2f} h" in out
    rows = out[out.index("scaling with"):].splitlines()[2:5]
    assert [int(_numbers(r)[0]) for r in rows] == [1, 2, 4] and _numbers(rows[0])[6] == 100.0
    eight = speed.predict(load("bert-large", ["precision=bf16"]), hardware.gpu("a100-80gb"), 8)
    assert _numbers(rows[2])[6] == pytest.approx(100 * p.samples_per_s / 32 / (eight.samples_per_s / 8), abs=0.06)


def test_a_batch_ramp_is_timed_by_the_samples_its_steps_read():
    """train.batch_rampup: the plan's time to train is the samples that train.steps read, at the whole batch's
    samples/s; a data-parallel size that does not divide the ramp's batches is one line."""
    from pretrain.memory import data_parallel_size

    hw = hardware.gpu("h100")
    cfg = load("gpt3-small", ["train.micro_batch_size=2", "train.batch_rampup=[16,16,1953125]"])
    p, samples = speed.predict(cfg, hw, 8), cfg.train.samples_before(cfg.train.steps)
    assert samples < 572205 * 256  # (the ramp's steps read fewer)
    assert (f"time to train 572,205 steps ({samples:,} samples: the batch ramps): "
            f"{speed._duration(samples / p.samples_per_s)}") in speed.report(cfg, hw, 8)
    with pytest.raises(ConfigError, match=r"^train.batch_rampup=\[16, 16, 1953125\]: its batches are not whole "
                                          r"numbers of samples per data-parallel rank \(data-parallel size 32\); make "
                                          r"START and INCREMENT multiples of 32$"):
        data_parallel_size(cfg, 32)
    assert data_parallel_size(load("gpt3-small", ["train.micro_batch_size=2"]), 24) == 24  # (no ramp: its own checks)


def test_scaling_takes_the_micro_batch_auto_picks_at_each_size():
    """With train.micro_batch_size=auto the 1-node row is the run a user would start on 1 node (auto's micro batch
    there), not the 32-node micro batch with 32 accumulation steps, whose launches made 32 nodes look superlinear."""
    from pretrain.memory import with_micro_batch

    out = run_cli("pretrain", "plan", "--config", "gpt2-medium", "--gpu", "a100-80gb", "--nodes", "32").stdout
    rows = out[out.index("scaling with the same global batch, the micro batch as auto"):].splitlines()[2:]
    cfg, memory = load("gpt2-medium"), hardware.gpu("a100-80gb").memory_gib
    picks = []
    for r in rows:
        nodes, gpus, micro, acc = map(int, _numbers(r)[:4])
        picked = with_micro_batch(cfg, gpus, memory).train
        assert (micro, micro * acc * gpus) == (picked.micro_batch_size, cfg.train.global_batch_size), r
        assert _numbers(r)[6] <= 100.0, r  # per-GPU efficiency against 1 node
        picks.append(micro)
    assert len(rows) == 6 and picks[0] > picks[-1]


def test_compare_ranks_the_layouts_that_fit_by_predicted_time():
    out = run_cli("pretrain", "plan", "--config", "bert-large", "--gpu", "a100-40gb", "--gpus", "16", "--compare",
                  "--set", "precision=bf16", "train.global_batch_size=1024").stdout
    rows = [x for x in out.splitlines() if re.match(r"\s+\d+\s+\d+\s+\d\s+\d+\s+(yes|no)", x)]
    assert len(rows) == 12 and "slower layouts not shown" in out
    steps = [_numbers(r.split("ms")[0])[-1] for r in rows]
    assert steps == sorted(steps) and rows[0].endswith("fastest")
    assert all(_numbers(r)[4] <= 40 for r in rows)  # GiB per GPU within the A100 40GB
    assert "do not fit in 40 GiB" in out
    assert all(re.search(r"(\+[\d.,]+ ms (compute|memory-bound|tensor-parallel|data-parallel|optimizer))|as fast", r)
               for r in rows[1:])
    tp, zero, micro, ckpt = (rows[0].split()[i] for i in (1, 2, 3, 4))
    best = speed.predict(load("bert-large", ["precision=bf16", "train.global_batch_size=1024", f"parallel.tp={tp}",
                                             f"zero.stage={zero}", f"train.micro_batch_size={micro}",
                                             f"model.activation_checkpointing={ckpt == 'yes'}"]),
                         hardware.gpu("a100-40gb"), 16)
    assert _numbers(rows[0].split("ms")[0])[-1] == pytest.approx(1e3 * best.step, abs=0.06)


def test_a_scaling_efficiency_over_100_percent_says_why():
    """With auto's micro batch a larger one fits on more GPUs (a smaller ZeRO share each): a per-GPU efficiency over
    100% follows, and the table says why; one at or below 100% says nothing."""
    from pretrain.memory import with_micro_batch

    for preset, sets, gpu, over in (("xlnet-large", ["precision=fp16"], "v100-32gb", True),
                                    ("gpt2-medium", [], "a100-80gb", False)):
        cfg, hw = load(preset, sets), hardware.gpu(gpu)
        at = lambda gpus: with_micro_batch(cfg, gpus, hw.memory_gib)  # noqa: E731
        out = speed.report(at(32), hw, 32, hardware.Efficiency(), None, at)
        rows = out[out.index("scaling with the same global batch"):].splitlines()[2:5]
        assert (max(_numbers(r)[6] for r in rows) > 100) == over == ("(over 100%: on more GPUs each holds" in out)


def test_compare_prices_counted_launches_and_says_when_the_host_bounds_a_layout():
    """--compare --count-launches prices every layout with the launches counted (moved by what its layout changes),
    as the report below it does for the config's own; a layout the host bounds is said to be slower for its launches,
    by its step's difference, not a device part's."""
    from pretrain import plan
    from pretrain.cost import Launches

    cfg, hw, eff = _bert("train.global_batch_size=256"), hardware.gpu("h100"), hardware.Efficiency()
    counted = Launches(first=9000, per_micro_batch=9000, optimizer=300)  # a count far above the estimate
    out = plan.ranking(cfg, hw, 8, eff, hw.memory_gib, counted, top=100)
    rows = [r.split() for r in out.splitlines()[2:] if r.split()[0].isdigit()]
    own = [r for r in rows if r[1:5] == [str(cfg.parallel.tp), str(cfg.zero.stage), str(cfg.train.micro_batch_size),
                                         "yes" if cfg.model.activation_checkpointing else "no"]]
    assert len(own) == 1 and float(own[0][6]) == pytest.approx(
        1e3 * speed.predict(cfg, hw, 8, eff, launches=counted).step, abs=0.06)
    ms = lambda text: float(text.replace(",", ""))  # noqa: E731
    host = [r for r in rows if "host-bound" in r]
    assert host and all(ms(r[r.index("host-bound") - 2]) == pytest.approx(ms(r[6]) - ms(rows[0][6]), abs=0.11)
                        for r in host)


def test_hardware_is_data_and_bad_hardware_is_one_line(tmp_path):
    entry = yaml.safe_load(open(hardware.HARDWARE_FILE))["gpus"]["a100-80gb"]
    own = tmp_path / "my-gpu.yaml"
    own.write_text(yaml.safe_dump({**entry, "hbm_gbps": entry["hbm_gbps"] / 2}))
    cfg = _bert("train.global_batch_size=256")
    slower = speed.predict(cfg, hardware.gpu(str(own)), 8)
    same = speed.predict(cfg, hardware.gpu("a100-80gb"), 8)
    assert slower.memory > same.memory and slower.compute == same.compute
    cases = {("--gpu", "b200"): "unknown GPU; known: h100-nvl", ("--gpu", "a100-80gb", "--interconnect", "8xfoo"):
             "unknown network 'foo'", ("--gpu", "a100-80gb", "--interconnect", "hdr"): "is not NICSxNAME",
             ("--gpu", str(tmp_path / "none.yaml")): "no such file", ("--gpu", "v100-32gb", "--set", "precision=bf16"):
             "no bf16 tensor cores", ("--gpu", "h100", "--efficiency", "matmul=2"): "is in (0, 1]"}
    cases[("--gpu", "h100", "--gpus", "12", "--nodes", "8")] = "do not make --nodes 8 of equal size"
    (tmp_path / "half.yaml").write_text("peak_tflops: {bf16: 100}\n")
    cases[("--gpu", str(tmp_path / "half.yaml"))] = "missing gpus_per_node, hbm_gbps"
    (tmp_path / "pascal.yaml").write_text(yaml.safe_dump({**entry, "generation": "pascal"}))
    cases[("--gpu", str(tmp_path / "pascal.yaml"))] = "generation 'pascal' is not one of volta, ampere, hopper; give"
    cases[("--gpu", "h100", "--interconnect", "8x0")] = "a NIC's rate is a positive number of Gb/s"
    cases[("--interconnect", "8xhdr", "--launch-us", "5")] = "--interconnect, --launch-us are for the speed prediction"
    for args, message in cases.items():
        proc = run_cli("pretrain", "plan", "--config", "bert-tiny", "--set", "model.vocab_size=100", *args, check=False)
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    fields = {"memory_gib": ("80GB", "memory_gib: '80GB' is not a positive number"),  # a file's values, each checked
              "peak_tflops": (312, "peak_tflops is a mapping of precision to dense TFLOP/s"),
              "hbm_gbps": (0, "hbm_gbps: 0 is not a positive number"),
              "nvlink_gbps": (-450, "nvlink_gbps: -450 is not a positive number"),
              "gpus_per_node": (2.5, "gpus_per_node: 2.5 is not a positive whole number"),
              "network": ("fast", "network: 'fast' is not NICSxNAME"), "matmul": (3, "matmul: 3 is a fraction")}
    for field, (value, message) in fields.items():
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump({**entry, field: value}))
        with pytest.raises(hardware.HardwareError, match=re.escape(message)):
            hardware.gpu(str(tmp_path / "bad.yaml"))
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({**entry, "peak_tflops": {"bf16": float("nan")}}))
    with pytest.raises(hardware.HardwareError, match="peak_tflops.bf16: nan is not a positive number"):
        hardware.gpu(str(tmp_path / "bad.yaml"))
    (tmp_path / "bad.yaml").write_text("a: [\n")
    with pytest.raises(hardware.HardwareError, match="not valid YAML"):
        hardware.gpu(str(tmp_path / "bad.yaml"))
    for spec in ("8x-100", "8xnan", "8xinf"):
        with pytest.raises(hardware.HardwareError, match="a NIC's rate is a positive number"):
            hardware.gpu("h100", spec)


@pytest.mark.distributed
def test_check_puts_the_prediction_next_to_a_real_run(train_data, tmp_path):
    """A real (CPU) run, checked against a hardware file describing a slow accelerator: the measured step time is
    the median of the logged steps after the first two, the prediction is `predict` for the run's config and
    launch, and the fitted matmul efficiency reproduces the measured step time; where the host bounds the step (its
    launches counted), the fitted time per launch does."""
    run = tmp_path / "run"
    run_cli("pretrain", "train", "--config", "bert-tiny", "--set", f"data.path={os.path.relpath(train_data, ROOT)}",
            "data.num_workers=0",
            "data.seq_len=32", "model.max_position_embeddings=32", "train.global_batch_size=8",
            "train.micro_batch_size=4", "train.steps=6", "optimizer.warmup_steps=1", "train.eval_interval=0",
            "train.eval_steps=1",
            "data.valid_fraction=0.02", "checkpoint.keep=1", f"out_dir={run}")
    launch = json.load(open(run / "launch.json"))
    assert launch == {"device": "cpu", "world_size": 1, "tp": 1, "dp": 1, "gpus_per_node": 1,
                      "threads_per_rank": torch.get_num_threads(),  # (what torch takes by itself here too)
                      "first_step": 0, "cwd": ROOT}
    unknown = run_cli("pretrain", "plan", "--check", str(run), check=False)
    assert unknown.returncode == 2 and "ran on 'cpu'" in unknown.stderr and "--gpu" in unknown.stderr
    accelerator = tmp_path / "slow.yaml"
    accelerator.write_text(yaml.safe_dump({"peak_tflops": {"fp32": 1.0}, "memory_gib": 16, "hbm_gbps": 20,
                                           "nvlink_gbps": 5, "gpus_per_node": 8, "network": "1x10",
                                           "pcie_gbps": 5, "host_memory_gbps": 20, "generation": "ampere"}))
    out = run_cli("pretrain", "plan", "--check", str(run), "--gpu", str(accelerator), "--launch-us", "0.001").stdout
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    measured = statistics.median(r["step_time_s"] for r in rows[2:])
    device = dataclasses.replace(hardware.gpu(str(accelerator), gpus_per_node=1), launch_us=0.001)  # (a free host)
    predicted = speed.predict(load(str(run / "config.yaml")), device, 1)
    line = next(x for x in out.splitlines() if x.strip().startswith("step time"))
    assert _numbers(line)[:3] == pytest.approx([1e3 * predicted.step, 1e3 * measured, measured / predicted.step],
                                               abs=0.06)
    assert "(4 steps)" in out and "(a CPU run: its measures are not slow's" in out
    fitted = float(re.search(r"--efficiency matmul=([\d.]+)", out).group(1))
    refit = speed.predict(load(str(run / "config.yaml")), device, 1, hardware.Efficiency(matmul=fitted))
    assert refit.step == pytest.approx(measured, rel=0.01)
    # a host that takes 0.1 s a launch bounds the step: the launches counted on the run's data, the host's time fitted
    # (from another directory than the run's: its relative data.path is the run's, counted on the run's data)
    host = subprocess.run([sys.executable, "-m", "pretrain", "plan", "--check", str(run), "--gpu", str(accelerator),
                           "--count-launches", "--launch-us", "100000"], cwd=tmp_path, capture_output=True, text=True,
                          check=True).stdout
    assert "bound by the host" in host and "x 100000 us" in host
    counted = int(re.search(r"([\d,]+) launches \(counted\)", host).group(1).replace(",", ""))
    assert counted > speed.predict(load(str(run / "config.yaml")), hardware.gpu(str(accelerator), gpus_per_node=1),
                                   1).launches / 2  # (not the estimate's by construction: BERT's, narrowed)
    fitted_us = float(re.search(r"--launch-us ([\d.e+-]+) \(now 100000\)", host).group(1))
    assert fitted_us * counted * 1e-6 == pytest.approx(measured, rel=0.01)
    (run / "launch.json").write_text(json.dumps({**launch, "first_step": 3}))  # resumed at step 3: its steps only
    checked = run_cli("pretrain", "plan", "--check", str(run), "--gpu", str(accelerator)).stdout
    assert "(1 steps)" in checked  # steps 4-6, the first two left out (warm-up)


def test_bench_prints_the_anchor_and_preset_tables():
    import subprocess

    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "speed_model.py")], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert all(f"| {a['name']} |" in out for a in ANCHORS) and out.count("| NO |") == 0
    for workload in speed_model.WORKLOADS:
        assert len(re.findall(rf"\| {workload} \| (a100-80gb|h100) \| (1|4|32) \|", out)) == 6
