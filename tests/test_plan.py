"""`ptm plan`: parameter counts against the real model, model-state bytes against DeepSpeed's estimators,
FLOPs against the published formulas, and the command line."""
import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli
from pretrain.config import ConfigError, load
from pretrain.models.config import FUSED_CHUNK_BYTES, ModelConfig
from pretrain.cost import activation_bytes, count_parameters, largest_module, model_flops_per_sample
from pretrain.plan import COMPONENTS, checkpoint_bytes, estimate
from pretrain.hardware import mfu, peak_flops

GPT2_SMALL = ModelConfig(arch="gpt2", vocab_size=50257, hidden_size=768, num_layers=12, num_heads=12,
                         ffn_hidden_size=3072, max_position_embeddings=1024, type_vocab_size=0)


def tiny(arch: str) -> ModelConfig:
    return ModelConfig(arch=arch, vocab_size=99, vocab_pad_to=8, hidden_size=32, num_layers=2, num_heads=4,
                       ffn_hidden_size=48, max_position_embeddings=64, type_vocab_size=0 if arch == "gpt2" else 2,
                       task_type_vocab_size=3 if arch == "ernie" else 0, generator_size=0.5 if arch == "electra" else 0)


FEATURE_MIXES = {"bert-pre-lm": ("bert", dict(norm="pre", heads=["lm"])), "gpt2-mlm-nsp": ("gpt2", dict(heads=["mlm", "nsp"])),
                 "bert-no-nsp": ("bert", dict(heads=["mlm"])), "albert-e16": ("albert", dict(embedding_size=16)),
                 "bert-share-attention": ("bert", dict(share_layers="attention")),
                 "gpt2-share-ffn": ("gpt2", dict(share_layers="ffn"))}


@pytest.mark.parametrize("arch", ["bert", "gpt2", "ernie", "roberta", "electra", "nezha", *FEATURE_MIXES])
def test_parameter_counts_match_the_model(arch):
    """Also for features mixed differently than any arch does: the count follows the features, not the name."""
    from deepspeed.runtime.zero.stage3 import model_to_params

    from pretrain.models.model import Pretraining
    from pretrain.parallel import mcore

    mcore.initialize(1, 0)
    base, features = FEATURE_MIXES.get(arch, (arch, {}))
    m = dataclasses.replace(tiny(base), **features)
    model = Pretraining(m)
    params = list(model.parameters())
    assert count_parameters(m) == sum(p.numel() for p in params)
    # one rank of TP=2: megatron marks the parameters it splits (and along which dim); the rest is replicated
    split = [p for p in params if getattr(p, "tensor_model_parallel", False)]
    assert all(p.shape[p.partition_dim] % 2 == 0 for p in split)
    assert count_parameters(m, tp=2) == sum(p.numel() for p in params) - sum(p.numel() for p in split) // 2
    assert largest_module(m) == model_to_params(model)[1]


@pytest.mark.parametrize("preset", sorted(p[:-5] for p in os.listdir(os.path.join(ROOT, "configs")) if p.endswith(".yaml")))
def test_the_cost_module_counts_every_preset_as_the_model_built_on_the_meta_device(preset):
    """pretrain/cost.py counts parameters from the config alone; the model the trainer builds (with the heads its
    objective adds), on the meta device, has exactly as many."""
    import torch

    from pretrain import cost, models, objectives
    from pretrain.parallel import mcore

    cfg = load(preset)
    cfg.model.vocab_size = cfg.model.vocab_size or 30522  # the tiny presets take the dataset's
    objective = objectives.get(cfg.data.objective)
    heads = objective.heads(cfg, frozen=False)  # not a distillation's teacher, read from its checkpoint
    with torch.device("meta"):
        model = models.build(cfg.model, heads=heads, tp=mcore.OneRank())
    assert cost.count_parameters(cfg.model) + cost.objective_parameters(cfg) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("offload", [False, True])
def test_model_states_match_deepspeed_estimators(stage, offload):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    cfg = load("bert-large", [f"zero.stage={stage}", f"zero.offload={str(offload).lower()}"])
    plan = estimate(cfg, world_size=8)
    n, gpus = plan.params, 8
    ours = plan.weights + plan.gradients + plan.optimizer_states + plan.zero3_gathered
    if stage == 2:
        _, ds = estimate_zero2_model_states_mem_needs(n, num_gpus_per_node=gpus, cpu_offload=offload)
    else:
        _, ds, gathered = estimate_zero3_model_states_mem_needs(n, largest_module(cfg.model), num_gpus_per_node=gpus,
                                                                cpu_offload=offload, cpu_offload_params=False)
        assert plan.zero3_gathered == gathered  # 16-bit weights and gradients of the largest module
    # Same components: 16-bit weights (2 bytes/param, replicated below ZeRO-3), 16-bit gradients (2), fp32 master
    # copy (4) and Adam moments (8), partitioned by stage. Without offload DeepSpeed counts 18 bytes/param/GPU
    # where we count 14 (ZeRO-2: + 4 for an fp32 gradient partition that exists only during the optimizer step,
    # after the activations are freed) or 16 (ZeRO-3: DeepSpeed's 18 is the same list, without the 2-byte 16-bit
    # weight partition). With offload both keep only the 16-bit weights (and ZeRO-3's gathered module) on the GPU.
    extra = 0 if offload else {2: 4, 3: 2}[stage] * n / gpus
    assert abs(ds - (ours + extra)) <= 2  # DeepSpeed rounds its per-GPU share once, we round per component


def test_activations_follow_korthikanti_with_the_kernels_ptm_runs():
    """Korthikanti et al.'s count per layer, with flash / memory-efficient attention's logsumexp (4*a*s*b/t) in place
    of the kept s x s probabilities (5*a*s^2*b/t), which NEZHA's relative attention keeps; the LM head's fp32 logits,
    or with the fused loss (TP=1, not fp16) what it keeps: the input's gradient, the weight-gradient sum, a chunk."""
    cfg = load("bert-large", ["parallel.tp=2", "model.activation_checkpointing=false"])
    s, b, h, a, t, L = 512, 16, 1024, 16, 2, 24  # ffn = 4h: the paper's 24/t
    layer = s * b * h * (10 + 24 / t) + 4 * a * s * b / t
    layers, logits = activation_bytes(cfg, b)
    assert layers == L * layer
    assert logits == 4 * b * 77 * cfg.model.padded_vocab / t  # fp32 logits of the 77 masked positions
    cfg.model.activation_checkpointing = True
    assert activation_bytes(cfg, b)[0] == L * 2 * s * b * h + layer  # inputs kept, one layer recomputed
    cfg.model.activation_checkpointing = [0, 5]
    assert activation_bytes(cfg, b)[0] == (L - 2) * layer + 2 * 2 * s * b * h + layer
    cfg.precision = "fp32"
    fp32 = 2 * s * b * h * (10 + 24 / t) + 4 * a * s * b / t  # the logsumexp is fp32 in any precision
    assert activation_bytes(cfg, b)[0] == (L - 2) * fp32 + 2 * 2 * 2 * s * b * h + fp32
    nezha = load("nezha-base", ["parallel.tp=2", "data.seq_len=512", "model.max_position_embeddings=512"])
    h, a, L = nezha.model.hidden_size, nezha.model.num_heads, nezha.model.num_layers
    assert activation_bytes(nezha, b)[0] == L * s * b * h * (10 + 24 / t + 5 * a * s / (h * t))  # Korthikanti's
    fused = load("bert-large", ["model.activation_checkpointing=false", "precision=bf16", "fused_lm_loss=auto"])
    v, h = fused.model.padded_vocab, fused.model.hidden_size
    rows = b * 77  # the input's gradient, a chunk of 1232 x V bf16 logits (77 MB: under FUSED_CHUNK_BYTES), the sum
    assert activation_bytes(fused, b)[1] == rows * h * 2 + rows * v * 2 + 4 * v * h  # not b x 77 x V fp32 logits
    assert activation_bytes(fused, 256)[1] == 256 * 77 * h * 2 + FUSED_CHUNK_BYTES + 4 * v * h  # a chunk at a time
    fused.parallel.tp = 2
    assert activation_bytes(fused, b)[1] == 4 * b * 77 * v / 2


def test_largest_micro_batch_is_the_edge():
    cfg = load("bert-large", ["train.micro_batch_size=16"])
    plan = estimate(cfg, 8, gpu_memory_gib=24)
    assert plan.fits and plan.max_micro_batch > cfg.train.micro_batch_size
    cfg.train.micro_batch_size = plan.max_micro_batch
    assert estimate(cfg, 8, 24).fits
    cfg.train.micro_batch_size += 1
    assert not estimate(cfg, 8, 24).fits


def test_auto_micro_batch_is_the_largest_divisor_that_fits():
    """train.micro_batch_size=auto: the largest divisor of the per-rank batch whose estimate fits HEADROOM of the
    memory; the next divisor up does not fit; no memory given: the whole per-rank batch; nothing fits: one line."""
    from pretrain.memory import HEADROOM, auto_micro_batch

    cfg = load("bert-large", ["train.global_batch_size=4096", "data.seq_len=128"])
    assert cfg.train.micro_batch_size == "auto"
    for gib, world in ((16, 8), (40, 8), (80, 16), (141, 8)):
        per_rank = 4096 // world
        picked = auto_micro_batch(cfg, world, gib)
        fixed = load("bert-large", ["train.global_batch_size=4096", "data.seq_len=128",
                                    f"train.micro_batch_size={picked}"])
        assert per_rank % picked == 0 and estimate(fixed, world, HEADROOM * gib).fits
        assert estimate(cfg, world, gib).activations == estimate(fixed, world, gib).activations  # picked alike
        bigger = [b for b in range(picked + 1, per_rank + 1) if per_rank % b == 0]
        if bigger:
            fixed.train.micro_batch_size = bigger[0]
            assert not estimate(fixed, world, HEADROOM * gib).fits
    assert auto_micro_batch(cfg, 8, 16) < auto_micro_batch(cfg, 8, 141) <= 512
    assert auto_micro_batch(cfg, 8, None) == 512
    with pytest.raises(ConfigError, match="not even micro batch 1 fits.*activation_checkpointing"):
        auto_micro_batch(cfg, 8, 2)
    with pytest.raises(ConfigError, match="neither a number nor auto"):
        load("bert-large", ["train.micro_batch_size=some"]).validate(8)


def test_flops_match_published_formulas():
    m, s = GPT2_SMALL, 1024
    L, h, V = m.num_layers, m.hidden_size, m.padded_vocab
    flops = model_flops_per_sample(m, s)
    # Megatron's model FLOPs (Korthikanti et al. 2022): 72*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h)) is 3 x forward,
    # without recomputation, so it equals ours exactly (f = 4h). The 4/3 larger 96*B*s*L*h^2*(1 + s/(6h) +
    # V/(16*L*h)) of Narayanan et al. 2021 is the one that counts the recomputed forward pass.
    assert flops == pytest.approx(72 * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h)), rel=1e-12)
    # nanoGPT / PaLM: 6*N*T + 12*L*h*T^2 with N all parameters (124M; embeddings stand in for the LM head)
    assert flops == pytest.approx(6 * count_parameters(m) * s + 12 * L * h * s**2, rel=0.01)
    bert = load("bert-large").model  # the MLM head (transform + logits) runs on the predicted tokens only
    extra = model_flops_per_sample(bert, 512, 77) - model_flops_per_sample(bert, 512, 0)
    assert extra == 6 * 77 * bert.hidden_size * (bert.padded_vocab + bert.hidden_size)
    # ELECTRA: the discriminator's blocks and per-token head, plus the generator (its blocks, its MLM head on the
    # predicted tokens, the projection of the shared embeddings to its width)
    electra = load("electra-base").model
    g, s = dataclasses.replace(bert, hidden_size=256, num_heads=4, ffn_hidden_size=1024, num_layers=12), 512
    h, e = 768, 768
    blocks = model_flops_per_sample(dataclasses.replace(bert, num_layers=12, hidden_size=h, ffn_hidden_size=3072,
                                                        vocab_size=30522), s, 0)
    generator = model_flops_per_sample(dataclasses.replace(g, vocab_size=30522, embedding_size=e), s, 77)
    assert generator - model_flops_per_sample(dataclasses.replace(g, vocab_size=30522, embedding_size=e), s, 0) == \
        6 * 77 * e * (electra.padded_vocab + 256)
    assert model_flops_per_sample(electra, s, 77) == pytest.approx(blocks + 6 * s * (h * h + h) + generator, rel=1e-12)
    # NEZHA: relative positions double the attention matmuls (q . a_ij next to q . k_j, p . a_ij next to p . v)
    nezha = load("nezha-base").model
    bert_base = dataclasses.replace(nezha, position_encoding="learned")
    assert model_flops_per_sample(nezha, s) - model_flops_per_sample(bert_base, s) == 12 * 12 * h * s * s


def test_peak_flops_and_mfu():
    assert peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert peak_flops("NVIDIA A100-PCIE-40GB", "fp32") == 19.5e12  # plain FP32: ptm leaves TF32 off
    assert peak_flops("NVIDIA H100 80GB HBM3", "fp16") == 989e12 == peak_flops("NVIDIA H200", "bf16")
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12 and peak_flops("Tesla V100-SXM2-32GB", "fp16") == 125e12
    assert peak_flops("NVIDIA H100 NVL", "bf16") == 835e12  # not the H100 SXM's 989e12
    assert peak_flops("Tesla V100-PCIE-32GB", "fp16") == 112e12 and peak_flops("Tesla V100S-PCIE-32GB", "fp16") == 130e12
    assert peak_flops("Tesla V100-SXM2-32GB", "bf16") is None and peak_flops("cpu", "fp32") is None
    assert mfu(156e12, "NVIDIA A100-SXM4-40GB", "bf16") == 0.5 and mfu(1e12, "cpu", "bf16") is None


def test_checkpoint_size_and_the_warning_lead_time():
    """What each process writes (12 bytes per parameter of its TP shard: fp32 weights and two moments; split over DP
    ranks under ZeRO, by DP rank 0 alone without) and the Slurm warning lead time that leaves room for it."""
    cfg = load("bert-large", ["zero.stage=1", "parallel.tp=2"])
    plan = estimate(cfg, 16)
    assert checkpoint_bytes(cfg, plan) == (12 * plan.params_per_rank / 8, 16)
    cfg.zero.stage, cfg.grad_accum_dtype = 0, "bf16"
    assert checkpoint_bytes(cfg, estimate(cfg, 16)) == (12 * plan.params_per_rank, 2)
    slow = run_cli("pretrain", "plan", "--config", "gpt2-xl", "--gpus", "8", "--write-gbps", "0.05")
    fast = run_cli("pretrain", "plan", "--config", "gpt2-xl", "--gpus", "8", "--write-gbps", "10")
    lead = [int(p.stdout.split("--signal=B:USR1@")[1].split()[0]) for p in (slow, fast)]
    assert lead[0] > lead[1] >= 120 and "GiB per node of 8 GPUs" in slow.stdout


def test_cli_fits_and_suggests():
    ok = run_cli("pretrain", "plan", "--config", "configs/bert-large.yaml", "--gpus", "8", "--gpu-memory", "80")
    assert "336.3M parameters" in ok.stdout and "fits in 80 GiB" in ok.stdout
    small = run_cli("pretrain", "plan", "--config", "bert-tiny", "--gpus", "1", "--gpu-memory", "80")
    assert re.search(r"; largest micro batch that fits: [\d,]+ \(more than the 32 samples a rank takes of "
                     r"train.global_batch_size=32: its whole share fits in one micro-batch\)\n", small.stdout)
    big = run_cli("pretrain", "plan", "--config", "configs/bert-large.yaml", "--gpus", "8", "--gpu-memory", "16",
                  "--set", "train.micro_batch_size=512", check=False)
    assert big.returncode == 1 and "does not fit in 16 GiB" in big.stdout
    assert "--set train.micro_batch_size=" in big.stdout and "model.activation_checkpointing=true" in big.stdout
    bad = run_cli("pretrain", "plan", "--config", "bert-large", "--set", "zero.nope=1", check=False)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "unknown key 'zero.nope'" in bad.stderr
    run_cli("pretrain", "plan", "--config", "bert-large", "--set", "out_dir=README.md/run")  # a plan writes nothing:
    # an out_dir that cannot be made is the run's error, not the plan's (it validates every layout it ranks)
    one = run_cli("pretrain", "plan", "--config", "gpt3-175b", check=False)  # tp 8 on the 1 GPU counted by default
    assert one.returncode == 2 and one.stderr.strip() == ("plan: error: parallel.tp=8 needs more than the 1 GPU plan "
                                                          "counts without --gpus; give --gpus N (a multiple of 8) or "
                                                          "--gpu NAME")
    moved = run_cli("pretrain", "plan", "--config", "nezha-tiny", "--set", "model.position_encoding=learned")
    assert ("\nnote: model.max_relative_position=16 (from nezha-tiny.yaml) is not read with model.position_encoding="
            "learned (from --set): ignored\n") in moved.stdout  # a preset's key the choice made after it leaves unread
    unread = run_cli("pretrain", "plan", "--config", "nezha-tiny", "--set", "model.position_encoding=learned", "--set",
                     "model.max_relative_position=8", check=False)
    assert unread.returncode == 2 and unread.stderr.strip() == (
        "plan: error: model.max_relative_position=8 is not read with model.position_encoding=learned, only with "
        "position_encoding relative; remove it")
    node = run_cli("pretrain", "plan", "--config", "bert-tiny", "--gpu", "h100", check=False)  # a node of 8 GPUs
    assert node.returncode == 2 and "data-parallel size 8 (8 GPUs / parallel.tp=1)" in node.stderr
    assert "(--gpus N)" in node.stderr and len(node.stderr.strip().splitlines()) == 1


def test_cli_vocabulary_and_ptm_dispatch(tmp_path):
    with open(tmp_path / "manifest.json", "w") as f:
        json.dump({"vocab_size": 777, "shards": [], "tokenizer": {}}, f)  # what `ptm plan` reads of a dataset
    ds = run_cli("pretrain", "plan", "--config", "bert-tiny", "--set", f"data.path={tmp_path}")
    assert f"vocabulary 777 (dataset {tmp_path})" in ds.stdout
    ptm = os.path.join(os.path.dirname(sys.executable), "ptm")
    out = subprocess.run([ptm, "plan", "--config", "bert-tiny", "--vocab-size", "1000", "--compare", "--gpus", "2",
                          "--gpu-memory", "24"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "vocabulary 1000 (--vocab-size)" in out.stdout
    assert all(f"ZeRO-{s}" in out.stdout for s in range(4)) and "largest micro batch" in out.stdout
    usage = subprocess.run([ptm, "plan", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert usage.stdout.startswith("usage: ptm plan") and "--gpu-memory" in usage.stdout


def test_every_plan_option_has_help():
    from pretrain.cli import parser

    subs = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    for action in subs.choices["plan"]._actions:
        assert action.help and len(action.help) > 10, action.option_strings


@pytest.mark.parametrize("preset", ["bert-base", "roberta-base", "albert-base", "electra-base", "nezha-base", "gpt2",
                                    "gpt", "unilm-large", "gpt3-small", "gpt3-13b"])
def test_preset_parameter_counts_equal_hugging_face_classes(preset):
    """`ptm plan`'s count of a published size (vocabulary unpadded) equals the HF class's, built on the meta device
    (ELECTRA: ElectraForPreTraining + ElectraForMaskedLM, whose embedding tables are the discriminator's in ptm)."""
    import torch

    from checkpoints_tools.hf import adapter

    m = dataclasses.replace(load(preset).model, vocab_pad_to=1, pad_token_id=1)
    special = {"pad": 1, "cls": 0, "sep": 2, "eod": 0}
    family = adapter(m.arch)
    with torch.device("meta"):
        (_, _, cls), *companions = family.models(m)
        expected = family.hf_model_class(cls)(family.hf_config(m, special)).num_parameters()  # NEZHA: ptm's file
        for _, g, cls in companions:  # ELECTRA's generator
            gen = family.hf_model_class(cls)(family.hf_config(g, special))
            shared = gen.electra.embeddings
            expected += gen.num_parameters() - sum(p.numel() for n, p in shared.named_parameters())
            assert gen.config.hidden_size == 256 and gen.config.num_attention_heads == 4  # google/electra-base-generator
    assert count_parameters(m) == expected
    if preset == "albert-base":  # the published 12M: layers shared, embeddings factorised
        assert 11e6 < count_parameters(m) < 12.5e6


def test_the_parser_and_plan_import_neither_torch_nor_megatron():
    """`ptm plan` answers in a fraction of a second, and `python -m pretrain train` builds its parser (which imports
    pretrain.plan) before it watches for Slurm's stop signals: a 3 s import of torch and megatron-core there (as a
    kernel constant once brought in) let a USR1 during start-up kill the tasks (tests/test_slurm.py)."""
    code = ("import sys, pretrain.cli, pretrain.plan; pretrain.cli.parser(); "
            "print(sorted(m for m in ('torch', 'megatron.core', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


@pytest.mark.parametrize("preset, gated", [("t5-tiny", False), ("t5-tiny", True), ("mass-tiny", False)],
                         ids=["t5-1.0", "t5-1.1", "mass"])
def test_encoder_decoder_flops_are_three_times_the_matmuls_of_a_forward_pass(preset, gated):
    """cost.flops_per_sample of T5 (the encoder on data.seq_len, the decoder on the target length, each decoder
    layer's cross-attention over the encoder's output, gated MLPs, the LM head on every target token) and of MASS
    (the decoder on seq_len, the LM head on the masked half) equals three times the matmul FLOPs torch's
    FlopCounterMode counts in one forward pass, the LM head run on the predicted positions (SDPA's math kernel, whose
    matmuls it counts)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from pretrain import cost, models
    from pretrain.parallel import mcore

    mcore.initialize(tp=1, seed=0)
    gate = ["model.gated_mlp=true", "model.activation=gelu_tanh"] if gated else []
    cfg = load(preset, ["model.vocab_size=500", "model.hidden_dropout=0", "model.attention_dropout=0", *gate])
    s, t, p = cfg.data.seq_len, cost.decoder_tokens(cfg), cost.predicted_tokens(cfg)
    assert p < s and (t < s if preset == "t5-tiny" else t == s)  # the lengths are told apart
    model = models.build(cfg.model, tp=mcore.OneRank()).eval()
    ids, targets = torch.randint(0, 500, (2, s)), torch.randint(0, 500, (2, t))
    positions = torch.arange(2 * t).view(2, t)[:, :p].flatten()  # p predicted tokens per sequence
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as flops, torch.no_grad():
        model(ids, decoder_input_ids=targets, positions=positions)
    assert cost.flops_per_sample(cfg) == 3 * flops.get_total_flops() / 2


def test_a_memory_is_planned_as_its_attention_and_the_state_kept_between_steps():
    """XLNet large with model.mem_len 384 (XLNet's recipe; reuse_len 256): each layer's probabilities over s + 384 keys
    for both streams (the content stream's s tokens, the query stream's 85 predicted ones), the memory it reads with
    its keys and values; and between steps the memory of the rank's streams (global batch / dp of them, every layer,
    bf16): what `ptm plan` shows as its own row, and what each data-parallel rank adds to the checkpoint."""
    from pretrain.cost import stream_memory_bytes

    base = ["model.activation_checkpointing=false", "train.micro_batch_size=4", "train.global_batch_size=256"]
    cfg = load("xlnet-large", [*base, "model.mem_len=0", "model.reuse_len=0"])
    mem = load("xlnet-large", base)
    assert (mem.model.mem_len, mem.model.reuse_len) == (384, 256)
    s, m, b, h, a, f, L, k = 512, 85, 4, 1024, 16, 4096, 24, 384

    def stream(tokens, keys):
        return tokens * b * (10 * h + 8 * h + 4 * f + 5 * a * keys)
    assert activation_bytes(cfg, b)[0] == L * (stream(s, s) + stream(m, s))
    assert activation_bytes(mem, b)[0] == L * (stream(s, s + k) + stream(m, s + k) + k * b * 6 * h)
    assert stream_memory_bytes(cfg, 8) == 0
    assert stream_memory_bytes(mem, 8) == 256 // 8 * (L * k * h * 2 + k + 24)
    plan = estimate(mem, world_size=8, gpu_memory_gib=80)
    assert plan.stream_memory == stream_memory_bytes(mem, 8) and plan.total == sum(
        getattr(plan, c) for c in COMPONENTS)
    assert mem.zero.stage == 1 and checkpoint_bytes(mem, plan) == (12 * plan.params_per_rank / 8 + plan.stream_memory, 8)
    assert "memory of the streams" in run_cli("pretrain", "plan", "--config", "xlnet-large", "--gpus", "8").stdout
    out = run_cli("pretrain", "plan", "--config", "xlnet-large", "--gpus", "8", "--set", "model.mem_len=0",
                  "model.reuse_len=0")
    assert "memory of the streams" not in out.stdout
