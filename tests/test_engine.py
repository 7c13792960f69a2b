"""The distributed engine on CPU/gloo with real DeepSpeed and megatron-core: fp16 overflows are skipped, a NaN loss
stops the run, the torchrun / deepspeed / mpirun command lines train, the DeepSpeed JSON comes from the YAML, bf16
keeps fp32 masters, ELMo and the distilled students train in bf16 and fp16, ERNIE 2.0 runs under ZeRO-3. (Layout equivalence: test_fidelity.py; resume: test_resume.py.)"""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, free_port
from pretrain import checkpoint as C
from runs import config, launch

pytestmark = pytest.mark.distributed


def bert(train_data, *overrides):
    return ["bert-tiny", f"data.path={train_data}", "data.num_workers=0", "data.seq_len=32",
            "model.max_position_embeddings=32", "train.global_batch_size=8", "train.micro_batch_size=2",
            "optimizer.warmup_steps=2", "train.eval_interval=0", "train.eval_steps=2", "data.valid_fraction=0.02",
            "train.steps=12", "checkpoint.keep=0", *overrides]


def test_fp16_overflow_is_skipped_and_the_loss_scale_drops(train_data, tmp_path, capfd):
    """Dynamic loss scaling: a scale of 2**40 overflows fp16 gradients, every step is skipped and halves the scale,
    and no update reaches the weights (AdamW on torch's fused kernel), as the run's end says; from 2**20 the scale
    drops until steps apply (multi-tensor LAMB), and the weights stay finite."""
    from pretrain.train import Trainer

    fp16 = ("precision=fp16", "fp16.hysteresis=1", "zero.stage=2")
    trainer = Trainer(config(bert(train_data, *fp16, "fp16.initial_scale_power=40", "train.steps=3",
                                  f"out_dir={tmp_path / 'a'}")))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    assert all(p.dtype == torch.float16 for p in before.values())
    summary = trainer.fit()
    rows = [json.loads(line) for line in open(tmp_path / "a" / "metrics.jsonl")]
    assert [r["skipped_steps"] for r in rows] == [1, 2, 3] and summary["skipped_steps"] == 3
    assert [r["loss_scale"] for r in rows] == [2.0 ** 39, 2.0 ** 38, 2.0 ** 37]
    assert all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    assert "pretrain: 3 of the run's 3 steps were skipped (fp16 loss scaling" in capfd.readouterr().err

    trainer = Trainer(config(bert(train_data, *fp16, "fp16.initial_scale_power=20", "train.steps=8",
                                  "optimizer.name=lamb", "optimizer.multi_tensor=on", f"out_dir={tmp_path / 'b'}")))
    assert trainer.optimizer.foreach  # the multi-tensor LAMB of GPUs, on fp32 masters
    summary = trainer.fit()
    rows = [json.loads(line) for line in open(tmp_path / "b" / "metrics.jsonl")]
    skipped = [r["skipped_steps"] for r in rows]
    assert 0 < skipped[-1] < 8 and skipped[-1] == skipped[-2]  # overflows first, then steps that apply
    assert rows[-1]["loss_scale"] < 2 ** 20
    weights = C.load_full_model(C.resolve(str(tmp_path / "b")))
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert not all(torch.equal(before[n].float(), weights[n].half().float()) for n in before)


def test_fp16_without_zero_scales_the_loss_and_updates_as_zero_1_does(train_data, tmp_path):
    """DeepSpeed 0.19.8's engine.backward leaves the loss unscaled under ZeRO-0 fp16 while its wrapper still divides
    the gradients by the scale in step (deepspeed #8393): updates 2**16 times too small, overflows never seen. ptm
    scales the loss there: ZeRO-0 and ZeRO-1 make the same updates and log the same gradient norms, and a scale of
    2**30 overflows (steps skipped, the scale halved) under ZeRO-0 too."""
    from pretrain.train import Trainer

    updates, norms = {}, {}
    for stage in (0, 1):
        out = tmp_path / f"z{stage}"
        trainer = Trainer(config(bert(train_data, "precision=fp16", f"zero.stage={stage}", "train.grad_clip=0",
                                      "train.steps=3", f"out_dir={out}")))
        before = {n: p.detach().float().clone() for n, p in trainer.model.named_parameters()}
        trainer.fit()
        trainer.close()
        after = C.load_full_model(C.resolve(str(out)))
        updates[stage] = torch.cat([(after[n] - before[n]).flatten() for n in sorted(before)])
        norms[stage] = [json.loads(line)["grad_norm"] for line in open(out / "metrics.jsonl")]
    assert ((updates[0] - updates[1]).norm() / updates[1].norm()).item() < 1e-2
    assert norms[0] == pytest.approx(norms[1], rel=1e-3) and min(norms[0]) > 0.1
    trainer = Trainer(config(bert(train_data, "precision=fp16", "zero.stage=0", "fp16.hysteresis=1", "train.steps=2",
                                  "fp16.initial_scale_power=30", f"out_dir={tmp_path / 'overflow'}")))
    assert trainer.fit()["skipped_steps"] == 2
    assert [json.loads(line)["loss_scale"] for line in open(tmp_path / "overflow" / "metrics.jsonl")] == [2.0 ** 29,
                                                                                                         2.0 ** 28]
    trainer.close()


def test_a_nan_loss_stops_the_run_with_its_step_and_samples(train_data, tmp_path):
    """A genuine NaN (here: NaN weights from a checkpoint) is not a loss-scale overflow: under fp16 the run stops
    with exit code 3, naming the step and the global sample range, and writes no checkpoint."""
    from conftest import call_cli, run_cli

    run_cli("pretrain", "train", "--config", "bert-tiny", "--set", *bert(train_data, "train.steps=2")[1:],
            f"out_dir={tmp_path / 'ok'}")
    bad = C.load_full_model(C.resolve(str(tmp_path / "ok")))
    bad["embeddings.norm.weight"][0] = float("nan")
    call_cli("checkpoints_tools", "consolidate", tmp_path / "ok", "--out", tmp_path / "nan", "--weights-only")
    C.save_model(str(tmp_path / "nan"), bad)
    proc = run_cli("pretrain", "train", "--config", "bert-tiny", "--set", *bert(train_data, "precision=fp16")[1:],
                   f"checkpoint.init_from={tmp_path / 'nan'}", f"out_dir={tmp_path / 'run'}",
                   "train.skip_steps=[[5,6]]", check=False)
    assert proc.returncode == 3, proc.stderr[-3000:]
    said = "pretrain: error: the loss is not finite at step 1 (samples 0 to 7)"  # steps numbered from 1, as logged
    error = json.load(open(tmp_path / "run" / "failed.json"))  # (out_dir keeps why the run ended)
    assert error["error"].startswith(said) and error["error"] in proc.stderr.splitlines()
    assert error["exception"] == "FloatingPointError" and error["exit"] == 3
    assert error["error"].endswith("to leave them out, re-run with train.skip_steps=[[1,1],[5,6]] (it resumes from "
                                   "the last checkpoint)")  # (the whole list: a --set replaces it)
    assert not (tmp_path / "run" / "checkpoints").exists()
    # diverging (no clipping, a huge learning rate): every finite step is in metrics.jsonl, the last one included,
    # whose row waits for its gradient norm from the next step's transfer
    proc = run_cli("pretrain", "train", "--config", "bert-tiny", "--set", *bert(train_data, "train.steps=8")[1:],
                   "optimizer.lr=1e4", "train.grad_clip=0", "optimizer.warmup_steps=0", f"out_dir={tmp_path / 'up'}",
                   check=False)
    step = int(re.search(r"the loss is not finite at step (\d+) ", proc.stderr)[1])
    rows = [json.loads(line) for line in open(tmp_path / "up" / "metrics.jsonl")]
    assert step > 1 and [r["step"] for r in rows] == list(range(1, step)) and all("grad_norm" in r for r in rows)


def test_torchrun_command_line_tp2_zero2_lamb(train_data, tmp_path):
    """The README's command: `torchrun --nproc_per_node 4 -m pretrain train --config configs/bert-tiny.yaml --set
    parallel.tp=2 zero.stage=2 optimizer.name=lamb` (plus a small data set-up); rank 0 alone prints the summary.
    Four processes start side by side in one home directory and build nothing: no extension is compiled or loaded
    from torch's shared extensions cache (DeepSpeed JIT-built its CPU shared-memory op there at every start)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", f"--master_port={free_port()}",
           "-m", "pretrain", "train", "--config", "configs/bert-tiny.yaml", "--set", "parallel.tp=2", "zero.stage=2",
           "optimizer.name=lamb", *bert(train_data, "train.steps=3", "optimizer.warmup_steps=1")[1:], f"out_dir={tmp_path}"]
    home = tmp_path / "home"
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env={**environ, "HOME": str(home)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not (home / ".cache" / "torch_extensions").exists()
    assert not [line for line in (proc.stdout + proc.stderr).splitlines()
                if "built successfully" in line or "extension module" in line or "ninja" in line]
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert summary["steps"] == 3 and summary["layout"] == {"tp": 2, "dp": 2, "zero_stage": 2, "precision": "fp32"}
    meta = C.read_meta(C.resolve(str(tmp_path)))
    assert (meta["tp"], meta["dp"], meta["zero_stage"]) == (2, 2, 2)
    launch = json.load(open(tmp_path / "launch.json"))  # for `ptm plan --check`: torchrun's processes per node
    assert launch == {"device": "cpu", "world_size": 4, "tp": 2, "dp": 2, "gpus_per_node": 4, "threads_per_rank": 1,
                      "first_step": 0, "cwd": ROOT}


def test_deepspeed_launcher_zero3(train_data, tmp_path):
    """`deepspeed --num_gpus 2 --module pretrain train ...` (CPU processes here): the launcher's --local_rank is
    accepted, ZeRO-3 over 2 data-parallel ranks trains and checkpoints."""
    deepspeed = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    cmd = [deepspeed, "--num_gpus", "2", "--master_port", str(free_port()), "--module", "pretrain", "train",
           "--config", "bert-tiny", "--set", "zero.stage=3", *bert(train_data, "train.steps=2", "optimizer.warmup_steps=1")[1:],
           f"out_dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    meta = C.read_meta(C.resolve(str(tmp_path)))
    assert (meta["step"], meta["tp"], meta["dp"], meta["zero_stage"]) == (2, 1, 2, 3)


def test_deepspeed_json_comes_from_the_yaml_and_a_users_json_must_agree(train_data, tmp_path):
    from pretrain.config import ConfigError
    from pretrain.engine import ds_config

    cfg = config(bert(train_data, "zero.stage=3", "zero.offload=true", "precision=fp16", "train.grad_clip=0"))
    ds = ds_config(cfg, dp=2)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (8, 2, 2)
    assert ds["gradient_clipping"] == 0
    assert ds["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    assert ds["fp16"]["enabled"] and ds["fp16"]["initial_scale_power"] == 16 and not ds["bf16"]["enabled"]
    user = tmp_path / "ds.json"
    user.write_text(json.dumps({"zero_optimization": {"stage": 3, "overlap_comm": True}, "wall_clock_breakdown": False}))
    cfg.deepspeed_config = str(user)
    merged = ds_config(cfg, dp=2)
    assert merged["zero_optimization"] == {"stage": 3, "overlap_comm": True,
                                         "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    user.write_text(json.dumps({"zero_optimization": {"stage": 2}, "optimizer": {"type": "Adam"}}))
    with pytest.raises(ConfigError) as e:
        ds_config(cfg, dp=2)
    assert "zero_optimization.stage=2 but the config gives 3" in str(e.value) and "optimizer is ptm's" in str(e.value)
    user.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ds_config(cfg, dp=2)


def test_bf16_trains_with_bf16_weights_and_fp32_master_copies(train_data, tmp_path):
    """ZeRO-0 with bf16: DeepSpeed keeps an fp32 master copy per parameter (its unfused mixed-precision optimizer)."""
    from pretrain.train import Trainer

    trainer = Trainer(config(bert(train_data, "precision=bf16", "zero.stage=0", "grad_accum_dtype=bf16",
                                  "train.steps=3", f"out_dir={tmp_path}")))
    assert all(p.dtype == torch.bfloat16 for p in trainer.model.parameters())
    assert all(master.dtype == torch.float32 for master, _ in trainer.parallel.layout.tensors)
    summary = trainer.fit()
    assert summary["steps"] == 3 and summary["skipped_steps"] == 0
    weights = C.load_full_model(C.resolve(str(tmp_path)))
    assert all(torch.isfinite(w).all() and w.dtype == torch.float32 for w in weights.values())


HALF = {  # the newest families in half precision: preset, dataset fixture, first loss term, needs a teacher
    "elmo": ("elmo-tiny", "words_data", "fwd_loss", False),  # LSTMs with clipped cells, the softmax over words
    "distil": ("distilbert-tiny", "train_data", "soft_loss", True),  # the frozen teacher cast with the student
    "tinybert": ("tinybert-tiny", "train_data", "attention_loss", True),  # attention scores and projected states
}


@pytest.mark.parametrize("family", HALF)
def test_elmo_and_distilled_students_train_in_bf16_and_fp16(family, request, tmp_path):
    """bf16 (ZeRO-1) and fp16 (ZeRO-2, dynamic loss scale) runs start from the fp32 run's weights, cast: their first
    loss is the fp32 one within 2% (bf16) and 0.5% (fp16); every logged loss is finite, fp16 steps at least once, and
    the checkpoints hold finite fp32 weights."""
    from pretrain.train import Trainer

    preset, data, key, taught = HALF[family]
    common = [preset, f"data.path={request.getfixturevalue(data)}", "data.num_workers=0", "data.seq_len=32",
              "model.max_position_embeddings=32", "train.global_batch_size=8", "train.micro_batch_size=4",
              "optimizer.warmup_steps=1", "train.eval_interval=0", "data.valid_fraction=0.02", "train.steps=3",
              "train.log_interval=1"]
    if taught:
        common += [f"distill.teacher={request.getfixturevalue('bert_teacher')}", "distill.layer_steps=-1"]
    rows = {}
    for precision, stage in (("fp32", 1), ("bf16", 1), ("fp16", 2)):
        out = tmp_path / precision
        summary = Trainer(config([*common, f"precision={precision}", f"zero.stage={stage}", f"out_dir={out}"])).fit()
        rows[precision] = [json.loads(line) for line in open(out / "metrics.jsonl")]
        assert all(torch.isfinite(torch.tensor(r[key])) for r in rows[precision]), precision
        assert summary["skipped_steps"] < 3
        weights = C.load_full_model(C.resolve(str(out)))
        assert all(w.dtype == torch.float32 and torch.isfinite(w).all() for w in weights.values())
    first = rows["fp32"][0][key]
    assert rows["bf16"][0][key] == pytest.approx(first, rel=2e-2) and rows["bf16"][0][key] != first  # (half precision
    assert rows["fp16"][0][key] == pytest.approx(first, rel=5e-3) and rows["fp16"][0][key] != first  # rounds: it ran)


VIEWS = {"detach", "view", "select", "slice", "alias", "t", "transpose", "expand", "split_with_sizes", "lift_fresh",
         "_record_function_enter_new", "_record_function_exit"}  # ops that launch no kernel on a GPU


def test_bf16_optimizer_loops_launch_a_fixed_number_of_kernels_and_train_the_same_weights(train_data, tmp_path,
                                                                                           monkeypatch):
    """bf16 at ZeRO-1 (DeepSpeed's BF16_Optimizer): the fp32 accumulation of the gradients, their norm and their
    clipping launch as many kernels with 4 layers as with 2 (pretrain/parallel/multi_tensor.py: no loop over the
    parameters), and the weights after 3 clipped LAMB steps equal, bit for bit, those of DeepSpeed's own loops."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from deepspeed.runtime import bf16_optimizer
    from pretrain.parallel import multi_tensor
    from pretrain.train import Trainer

    class Launches(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Launches.n += func.overloadpacket.__name__ not in VIEWS
            return func(*args, **(kwargs or {}))

    def counted(fn):
        def run(*args, **kwargs):
            with Launches():
                return fn(*args, **kwargs)
        return run

    def train(layers: int, name: str):
        trainer = Trainer(config(bert(train_data, "precision=bf16", "zero.stage=1", "optimizer.name=lamb",
                                      "optimizer.multi_tensor=on", "train.grad_clip=0.05", "train.steps=3",
                                      f"model.num_layers={layers}", f"out_dir={tmp_path / name}")))
        opt = trainer.parallel.engine.optimizer
        assert type(opt) is bf16_optimizer.BF16_Optimizer
        opt.update_hp_grads, opt.step = counted(opt.update_hp_grads), counted(opt.step)
        Launches.n = 0
        summary = trainer.fit()
        assert summary["steps"] == 3 and min(r["grad_norm"] for r in map(json.loads, open(
            tmp_path / name / "metrics.jsonl"))) > 0.05  # every step clipped
        return Launches.n, C.load_full_model(C.resolve(str(tmp_path / name)))

    two, _ = train(2, "two")
    four, fast = train(4, "four")
    assert two == four, (two, four)
    monkeypatch.setattr(multi_tensor, "use", lambda engine: False)
    for name, original in multi_tensor.DEEPSPEED.items():
        monkeypatch.setattr(bf16_optimizer, name, original)
    loops, reference = train(4, "reference")
    assert loops > four + 3 * 4 * 16  # DeepSpeed's loops: several kernels per parameter and step
    assert fast.keys() == reference.keys() and all(torch.equal(fast[k], reference[k]) for k in fast)


def test_ernie2_multitask_under_tp2_dp2_zero3(train_data, tmp_path):
    """ERNIE 2.0's task heads see different tasks on different data-parallel ranks; under ZeRO-3 every rank still
    makes the same parameter gathers (each head of the stage runs, on no rows if need be), through both stages, with
    layer 1 recomputed in the backward pass (activation checkpointing gathers its parameters again)."""
    launch(tmp_path, {"ernie": ["ernie-tiny", f"data.path={train_data}", "data.num_workers=0", "data.seq_len=32",
                                "model.max_position_embeddings=32", "data.valid_fraction=0.02", "parallel.tp=2",
                                "zero.stage=3", "train.global_batch_size=8", "train.micro_batch_size=2",
                                "model.activation_checkpointing=[1]"]})
    summary = json.load(open(tmp_path / "ernie" / "summary.json"))
    assert summary["steps"] == 8 and summary["layout"]["zero_stage"] == 3
    assert {"valid_mlm_acc", "valid_sentence_reordering_acc", "valid_sentence_distance_acc"} <= summary.keys()


def test_mpirun_trains_data_parallel(train_data, tmp_path):
    """`mpirun -np 2 python -m pretrain train ...` (Open MPI): the ranks find each other through the rendezvous
    contract and train as DP=2 under ZeRO-2; rank 0 alone prints the summary."""
    import shutil

    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("Open MPI (mpirun) not installed (scripts/setup.sh installs it)")
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", f"MASTER_PORT={free_port()}",
           sys.executable, "-m", "pretrain", "train", "--config", "bert-tiny", "--set", "zero.stage=2",
           *bert(train_data, "train.steps=2", "optimizer.warmup_steps=1")[1:], f"out_dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count('"layout"') == 1
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert summary["layout"] == {"tp": 1, "dp": 2, "zero_stage": 2, "precision": "fp32"}
