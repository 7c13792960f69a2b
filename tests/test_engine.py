"""The distributed engine on CPU/gloo with real DeepSpeed and megatron-core: TP=2 x DP=2 under ZeRO 0-3 gives the
single-process weights (LAMB and AdamW), checkpoints resume exactly (also after SIGKILL, and after a kill during
a save) and across layouts, fp16 overflows are skipped, a NaN loss stops the run."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, free_port
from helpers import quick_build
from pretrain import checkpoint as C

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def dataset(small, sp_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("engine") / "ds"
    quick_build([small["path"]], out, tokenizer=sp_model)
    return str(out)


def gpt2(dataset, *overrides):
    """A tiny GPT-2 whose loss is a mean over equally many tokens per sample, so that any split of the global batch
    into micro-batches and ranks gives the same gradient; no dropout (its streams differ between layouts); clipping
    active (the norms are ~1-4)."""
    return ["gpt2-tiny", f"data.path={dataset}", "data.num_workers=0", "data.seq_len=32",
            "model.max_position_embeddings=32", "model.num_heads=4", "model.hidden_dropout=0",
            "model.attention_dropout=0", "train.global_batch_size=8", "train.micro_batch_size=2",
            "train.grad_clip=0.5", "optimizer.warmup_steps=1", "optimizer.lr=0.01", "train.eval_interval=0",
            "train.eval_steps=2", "data.valid_fraction=0.02", "train.steps=4", "checkpoint.interval=0", *overrides]


def worker(out, runs: dict, nproc: int) -> list[str]:
    """The torchrun command line of tests/engine_worker.py training `runs` into `out`."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
            os.path.join(ROOT, "tests", "engine_worker.py"), str(out), json.dumps(runs)]


def launch(out, runs: dict, nproc: int = 4):
    proc = subprocess.run(worker(out, runs, nproc), cwd=ROOT, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        errors = "\n".join(line for line in proc.stderr.splitlines() if "arning" not in line)
        raise AssertionError(f"exit {proc.returncode}\n{errors[-12000:]}")
    return proc


def weights(run_dir):
    return C.load_full_model(C.resolve(str(run_dir)))


def without_key_bias(state: dict, heads: int) -> dict:
    """The key bias has a zero gradient in exact arithmetic (softmax ignores a shift shared by a row of scores), so
    Adam-type optimizers turn its float noise into steps of lr * noise / eps that differ between any two
    summation orders. It is left out of the comparisons (per-head [q, k, v] layout)."""
    out = dict(state)
    for k, v in state.items():
        if k.endswith("attn.qkv.bias"):
            out[k] = v.view(heads, 3, -1)[:, [0, 2]].reshape(-1)
    return out


def max_rel_diff(a: dict, b: dict, heads: int = 4) -> float:
    """The largest per-tensor relative difference ||a - b|| / ||b||."""
    assert a.keys() == b.keys()
    a, b = without_key_bias(a, heads), without_key_bias(b, heads)
    return max(((a[k] - b[k]).norm() / b[k].norm().clamp(min=1e-12)).item() for k in a)


def test_tp2_dp2_matches_one_process_for_every_zero_stage(dataset, tmp_path):
    """4 optimizer steps of TP=2 x DP=2 under ZeRO 0, 1, 2 and 3 (2 and 3 also with the optimizer offloaded to CPU
    memory) against one process on the same global batches: LAMB and AdamW weights agree to 1e-5; a LAMB that takes trust
    ratios over ZeRO's flat partitions instead of parameters does not."""
    runs = {f"{opt}-z{stage}": gpt2(dataset, f"optimizer.name={opt}", "parallel.tp=2", f"zero.stage={stage}")
            for opt in ("lamb", "adamw") for stage in (0, 1, 2, 3)}
    for stage in (2, 3):
        runs[f"lamb-z{stage}offload"] = gpt2(dataset, "optimizer.name=lamb", "parallel.tp=2", f"zero.stage={stage}",
                                             "zero.offload=true")
    runs["lamb-z2-naive"] = gpt2(dataset, "optimizer.name=lamb", "parallel.tp=2", "zero.stage=2")
    launch(tmp_path, {f"{opt}-ref": gpt2(dataset, f"optimizer.name={opt}", "zero.stage=0") for opt in ("lamb", "adamw")},
           nproc=1)
    launch(tmp_path, runs)
    diffs = {name: max_rel_diff(weights(tmp_path / name), weights(tmp_path / f"{name.split('-')[0]}-ref"))
             for name in runs}
    print("max relative weight difference vs one process:", json.dumps(diffs))
    naive = diffs.pop("lamb-z2-naive")
    assert all(d < 1e-5 for d in diffs.values()), diffs
    assert naive > 1e-3  # trust ratios over ZeRO partitions instead of parameters: visibly different weights
    assert max_rel_diff(weights(tmp_path / "lamb-ref"), weights(tmp_path / "adamw-ref")) > 1e-2  # a real difference
    norms = [json.loads(line)["grad_norm"] for line in open(tmp_path / "lamb-z3" / "metrics.jsonl")]
    assert min(norms) > 0.5  # every step was clipped (train.grad_clip=0.5): the clipping is part of what agrees


def config(run: list):
    from pretrain.config import load

    return load(run[0], run[1:])


def bert(dataset, *overrides):
    """A tiny BERT with dropout on: resuming must restore every RNG stream to be exact."""
    return ["bert-tiny", f"data.path={dataset}", "data.num_workers=0", "data.seq_len=32",
            "model.max_position_embeddings=32", "train.global_batch_size=8", "train.micro_batch_size=2",
            "optimizer.warmup_steps=2", "train.eval_interval=0", "train.eval_steps=2", "data.valid_fraction=0.02",
            "train.steps=12", "checkpoint.keep=0", *overrides]


def start(out, runs: dict, nproc: int):
    return subprocess.Popen(worker(out, runs, nproc), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def kill_when(proc, ready, timeout=300):
    """SIGKILL the whole launcher process group as soon as ready() is true; fails if the run ended first."""
    import signal
    import time

    deadline = time.time() + timeout
    while not ready():
        assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.stderr.read()[-3000:]}"
        assert time.time() < deadline
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def losses_by_step(run_dir) -> dict:
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return {r["step"]: r["mlm_loss"] for r in rows}  # a resumed run's rows for a step replace the killed run's


def assert_same_checkpoints(a, b):
    pa, pb = C.Pieces(C.resolve(str(a))), C.Pieces(C.resolve(str(b)))
    assert pa.meta["step"] == pb.meta["step"]
    for kind in C.KINDS:
        assert all(torch.equal(pa.full(kind, n), pb.full(kind, n)) for n in pa.params), kind


def latest_step(run_dir) -> int:
    try:
        return int(open(run_dir / "checkpoints" / "latest").read().strip().split("_")[1])
    except (OSError, IndexError, ValueError):
        return -1


def test_sigkill_between_checkpoints_then_resume_is_exact(dataset, tmp_path):
    """ZeRO-2, DP=2: killed after the step-4 checkpoint, restarted: the same losses and bit-identical weights and
    moments at the end as a run that never stopped."""
    run = {"run": bert(dataset, "zero.stage=2", "checkpoint.interval=4")}
    launch(tmp_path / "straight", run, nproc=2)
    proc = start(tmp_path / "killed", run, nproc=2)
    kill_when(proc, lambda: latest_step(tmp_path / "killed" / "run") == 4)
    assert latest_step(tmp_path / "killed" / "run") == 4
    launch(tmp_path / "killed", run, nproc=2)
    straight, killed = tmp_path / "straight" / "run", tmp_path / "killed" / "run"
    assert losses_by_step(straight) == losses_by_step(killed)
    assert_same_checkpoints(straight, killed)


def test_kill_during_a_save_resumes_the_previous_checkpoint(dataset, tmp_path):
    """ZeRO-3, DP=2, a checkpoint every step: SIGKILL while one is being written leaves it invisible (no `latest`
    pointing at it, no complete directory under its name); the restart resumes the one before, ends exact."""
    run = {"run": bert(dataset, "zero.stage=3", "checkpoint.interval=1")}
    launch(tmp_path / "straight", run, nproc=2)
    folder = tmp_path / "killed" / "run" / "checkpoints"
    writing = lambda: folder.is_dir() and any(p.name.endswith(".tmp") and p.name >= ".step_00000003" for p in folder.iterdir())
    for _ in range(5):  # a save takes milliseconds: when the kill lands after it completed, resume and try again
        kill_when(start(tmp_path / "killed", run, nproc=2), writing)
        partial = [p for p in folder.iterdir() if p.name.endswith(".tmp")]
        if partial:
            break
    resumed_from = latest_step(tmp_path / "killed" / "run")
    assert partial and resumed_from >= 2
    assert (folder / f"step_{resumed_from:08d}" / "meta.json").is_file()
    assert int(partial[0].name.split("_")[1].split(".")[0]) >= resumed_from
    launch(tmp_path / "killed", run, nproc=2)
    assert not any(p.name.endswith(".tmp") for p in folder.iterdir())
    assert_same_checkpoints(tmp_path / "straight" / "run", tmp_path / "killed" / "run")


def test_layout_change_resume_consolidate_and_hf_export_from_tp2_dp2_zero3(dataset, tmp_path):
    """A TP=2 x DP=2 ZeRO-3 checkpoint: consolidated or resharded to TP=4 by one process it holds the same tensors
    (weights and moments); exported to HF its
    logits are the training model's; resumed as TP=1 x DP=2 under ZeRO-1 the run ends where a single process that
    never changed layout does (weights and LAMB moments: the optimizer state survived the change)."""
    import transformers
    from safetensors.torch import load_file

    from conftest import run_cli
    from pretrain.models.model import Pretraining
    from pretrain.parallel import mcore

    lamb = ("optimizer.name=lamb", "optimizer.schedule=constant")  # the LR does not depend on train.steps
    launch(tmp_path, {"ref": gpt2(dataset, *lamb, "train.steps=6", "zero.stage=0")}, nproc=1)
    launch(tmp_path, {"moved": gpt2(dataset, *lamb, "train.steps=3", "parallel.tp=2", "zero.stage=3")})
    ckpt = C.resolve(str(tmp_path / "moved"))
    assert len(os.listdir(os.path.join(ckpt, "shards"))) == 3 * 4  # 3 kinds x (2 TP x 2 ZeRO-3 partitions)
    run_cli("checkpoints_tools", "consolidate", tmp_path / "moved", "--out", tmp_path / "whole")
    whole = load_file(tmp_path / "whole" / "shards" / "param-tp00-dp000.safetensors")
    full = C.load_full_model(ckpt)
    assert whole.keys() == {f"{k}@0" for k in full} and all(torch.equal(whole[f"{k}@0"], v) for k, v in full.items())

    run_cli("checkpoints_tools", "reshard", tmp_path / "moved", "--tp", "4", "--out", tmp_path / "tp4")
    tp4 = C.Pieces(str(tmp_path / "tp4"))
    assert tp4.tp == 4 and len(os.listdir(tmp_path / "tp4" / "shards")) == 3 * 4
    assert all(torch.equal(tp4.full("exp_avg", n), C.Pieces(ckpt).full("exp_avg", n)) for n in full)

    run_cli("checkpoints_tools", "to-hf", tmp_path / "moved", "--out", tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    mcore.initialize(1, 0)
    cfg = C.model_config(C.read_meta(ckpt))
    ours = Pretraining(cfg).eval()
    ours.load_state_dict(full, strict=False)
    ids = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids)["logits"][..., :cfg.vocab_size], rtol=1e-5, atol=1e-5)

    launch(tmp_path, {"moved": gpt2(dataset, *lamb, "train.steps=6", "zero.stage=1")}, nproc=2)
    assert max_rel_diff(weights(tmp_path / "moved"), weights(tmp_path / "ref")) < 1e-5
    moments = [C.Pieces(C.resolve(str(tmp_path / run))) for run in ("moved", "ref")]
    for kind in ("exp_avg", "exp_avg_sq"):
        a, b = ({n: p.full(kind, n) for n in p.params} for p in moments)
        assert max_rel_diff(a, b) < 1e-4, kind


def test_fp16_overflow_is_skipped_and_the_loss_scale_drops(dataset, tmp_path):
    """Dynamic loss scaling: a scale of 2**40 overflows fp16 gradients, every step is skipped and halves the scale,
    and no update reaches the weights; from 2**20 the scale drops until steps apply, and the weights stay finite."""
    from pretrain.train import Trainer

    fp16 = ("precision=fp16", "fp16.hysteresis=1", "zero.stage=2")
    trainer = Trainer(config(bert(dataset, *fp16, "fp16.initial_scale_power=40", "train.steps=3",
                                  f"out_dir={tmp_path / 'a'}")))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    assert all(p.dtype == torch.float16 for p in before.values())
    summary = trainer.fit()
    rows = [json.loads(line) for line in open(tmp_path / "a" / "metrics.jsonl")]
    assert [r["skipped_steps"] for r in rows] == [1, 2, 3] and summary["skipped_steps"] == 3
    assert [r["loss_scale"] for r in rows] == [2.0 ** 39, 2.0 ** 38, 2.0 ** 37]
    assert all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters())

    trainer = Trainer(config(bert(dataset, *fp16, "fp16.initial_scale_power=20", "train.steps=8",
                                  f"out_dir={tmp_path / 'b'}")))
    summary = trainer.fit()
    rows = [json.loads(line) for line in open(tmp_path / "b" / "metrics.jsonl")]
    skipped = [r["skipped_steps"] for r in rows]
    assert 0 < skipped[-1] < 8 and skipped[-1] == skipped[-2]  # overflows first, then steps that apply
    assert rows[-1]["loss_scale"] < 2 ** 20
    weights = C.load_full_model(C.resolve(str(tmp_path / "b")))
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert not all(torch.equal(before[n].float(), weights[n].half().float()) for n in before)


def test_a_nan_loss_stops_the_run_with_its_step_and_samples(dataset, tmp_path):
    """A genuine NaN (here: NaN weights from a checkpoint) is not a loss-scale overflow: under fp16 the run stops
    with exit code 3, naming the step and the global sample range, and writes no checkpoint."""
    from conftest import run_cli

    run_cli("pretrain", "train", "--config", "bert-tiny", "--set", *bert(dataset, "train.steps=2")[1:],
            f"out_dir={tmp_path / 'ok'}")
    bad = C.load_full_model(C.resolve(str(tmp_path / "ok")))
    bad["embeddings.norm.weight"][0] = float("nan")
    run_cli("checkpoints_tools", "consolidate", tmp_path / "ok", "--out", tmp_path / "nan", "--weights-only")
    C.save_model(str(tmp_path / "nan"), bad)
    proc = run_cli("pretrain", "train", "--config", "bert-tiny", "--set", *bert(dataset, "precision=fp16")[1:],
                   f"checkpoint.init_from={tmp_path / 'nan'}", f"out_dir={tmp_path / 'run'}", check=False)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "the loss is not finite at step 0 (samples 0 to 7)" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_torchrun_command_line_tp2_zero2_lamb(dataset, tmp_path):
    """The README's command: `torchrun --nproc_per_node 4 -m pretrain train --config configs/bert-tiny.yaml --set
    parallel.tp=2 zero.stage=2 optimizer.name=lamb` (plus a small data set-up); rank 0 alone prints the summary."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", f"--master_port={free_port()}",
           "-m", "pretrain", "train", "--config", "configs/bert-tiny.yaml", "--set", "parallel.tp=2", "zero.stage=2",
           "optimizer.name=lamb", *bert(dataset, "train.steps=3", "optimizer.warmup_steps=1")[1:], f"out_dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert summary["steps"] == 3 and summary["layout"] == {"tp": 2, "dp": 2, "zero_stage": 2, "precision": "fp32"}
    meta = C.read_meta(C.resolve(str(tmp_path)))
    assert (meta["tp"], meta["dp"], meta["zero_stage"]) == (2, 2, 2)


def test_deepspeed_launcher_zero3(dataset, tmp_path):
    """`deepspeed --num_gpus 2 --module pretrain train ...` (CPU processes here): the launcher's --local_rank is
    accepted, ZeRO-3 over 2 data-parallel ranks trains and checkpoints."""
    deepspeed = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    cmd = [deepspeed, "--num_gpus", "2", "--master_port", str(free_port()), "--module", "pretrain", "train",
           "--config", "bert-tiny", "--set", "zero.stage=3", *bert(dataset, "train.steps=2", "optimizer.warmup_steps=1")[1:],
           f"out_dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    meta = C.read_meta(C.resolve(str(tmp_path)))
    assert (meta["step"], meta["tp"], meta["dp"], meta["zero_stage"]) == (2, 1, 2, 3)


def test_deepspeed_json_comes_from_the_yaml_and_a_users_json_must_agree(dataset, tmp_path):
    from pretrain.config import ConfigError
    from pretrain.engine import ds_config

    cfg = config(bert(dataset, "zero.stage=3", "zero.offload=true", "precision=fp16", "train.grad_clip=0"))
    ds = ds_config(cfg, dp=2)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (8, 2, 2)
    assert ds["gradient_clipping"] == 0 and ds["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    assert ds["fp16"]["enabled"] and ds["fp16"]["initial_scale_power"] == 16 and not ds["bf16"]["enabled"]
    user = tmp_path / "ds.json"
    user.write_text(json.dumps({"zero_optimization": {"stage": 3, "overlap_comm": True}, "wall_clock_breakdown": False}))
    cfg.deepspeed_config = str(user)
    merged = ds_config(cfg, dp=2)
    assert merged["zero_optimization"] == {"stage": 3, "overlap_comm": True, "offload_optimizer": {"device": "cpu"}}
    user.write_text(json.dumps({"zero_optimization": {"stage": 2}, "optimizer": {"type": "Adam"}}))
    with pytest.raises(ConfigError) as e:
        ds_config(cfg, dp=2)
    assert "zero_optimization.stage=2 but the config gives 3" in str(e.value) and "optimizer is ptm's" in str(e.value)
    user.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ds_config(cfg, dp=2)


def test_bf16_trains_with_bf16_weights_and_fp32_master_copies(dataset, tmp_path):
    """ZeRO-0 with bf16: DeepSpeed keeps an fp32 master copy per parameter (its unfused mixed-precision optimizer)."""
    from pretrain.train import Trainer

    trainer = Trainer(config(bert(dataset, "precision=bf16", "zero.stage=0", "train.steps=3", f"out_dir={tmp_path}")))
    assert all(p.dtype == torch.bfloat16 for p in trainer.model.parameters())
    assert all(master.dtype == torch.float32 for master, _ in trainer.engine.layout.tensors)
    summary = trainer.fit()
    assert summary["steps"] == 3 and summary["skipped_steps"] == 0
    weights = C.load_full_model(C.resolve(str(tmp_path)))
    assert all(torch.isfinite(w).all() and w.dtype == torch.float32 for w in weights.values())


def test_ernie2_multitask_under_tp2_dp2_zero3(dataset, tmp_path):
    """ERNIE 2.0's task heads see different tasks on different data-parallel ranks; under ZeRO-3 every rank still
    makes the same parameter gathers (each head of the stage runs, on no rows if need be), through both stages, with
    layer 1 recomputed in the backward pass (activation checkpointing gathers its parameters again)."""
    launch(tmp_path, {"ernie": ["ernie-tiny", f"data.path={dataset}", "data.num_workers=0", "data.seq_len=32",
                                "model.max_position_embeddings=32", "data.valid_fraction=0.02", "parallel.tp=2",
                                "zero.stage=3", "train.global_batch_size=8", "train.micro_batch_size=2",
                                "model.activation_checkpointing=[1]"]})
    summary = json.load(open(tmp_path / "ernie" / "summary.json"))
    assert summary["steps"] == 8 and summary["layout"]["zero_stage"] == 3
    assert {"valid_mlm_acc", "valid_sentence_reordering_acc", "valid_sentence_distance_acc"} <= summary.keys()


def test_rendezvous_contract():
    from launchers.rendezvous import RendezvousError, export

    env = {"RANK": "3", "WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}
    assert export(env) == "torchrun/deepspeed" and env["RANK"] == "3"  # torch's variables win
    assert export({}) is None and export({"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"}) is None
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert export(env) == "mpirun"
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_ADDR"]) == ("1", "2", "1", "127.0.0.1")
    with pytest.raises(RendezvousError, match="MASTER_ADDR"):  # two nodes: where is rank 0?
        export({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})


def test_mpirun_trains_data_parallel(dataset, tmp_path):
    """`mpirun -np 2 python -m pretrain train ...` (Open MPI): the ranks find each other through the rendezvous
    contract and train as DP=2 under ZeRO-2; rank 0 alone prints the summary."""
    import shutil

    mpirun = shutil.which("mpirun")
    if mpirun is None and os.environ.get("CI") != "true":
        pytest.skip("Open MPI not installed (scripts/setup.sh installs it)")
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", f"MASTER_PORT={free_port()}",
           sys.executable, "-m", "pretrain", "train", "--config", "bert-tiny", "--set", "zero.stage=2",
           *bert(dataset, "train.steps=2", "optimizer.warmup_steps=1")[1:], f"out_dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count('"layout"') == 1
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert summary["layout"] == {"tp": 1, "dp": 2, "zero_stage": 2, "precision": "fp32"}
