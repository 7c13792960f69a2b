"""Resume proves itself: every restart here uses another seed than the run it resumes, so a restart that ignored
its checkpoint (fresh weights, data order and dropout from the new seed) could not end bit-identical or within
1e-5. Resume refuses what does not fit, falls back from damaged checkpoints, and the precision x ZeRO x optimizer
matrix checks the optimizer's step count, the loss scale and bit-identical weights after a resume."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, call_cli, free_port, run_cli
from pretrain import checkpoint as C
from pretrain.checkpoint_manager import Checkpoints, resume_mismatches
from runs import (assert_same_checkpoints, config, facts, kill_when, latest_step, launch, losses_by_step,
                  max_rel_diff, start, summary, weights)

pytestmark = pytest.mark.distributed


def bert(data, *overrides):
    """A tiny BERT with dropout on: resuming must restore every RNG stream to be exact."""
    return ["bert-tiny", f"data.path={data}", "data.num_workers=0", "data.seq_len=32",
            "model.max_position_embeddings=32", "train.global_batch_size=8", "train.micro_batch_size=2",
            "optimizer.warmup_steps=2", "train.eval_interval=0", "train.eval_steps=2", "data.valid_fraction=0.02",
            "train.steps=12", "checkpoint.keep=0", "train.log_interval=100", *overrides]


def gpt2(data, *overrides):
    return ["gpt2-tiny", f"data.path={data}", "data.num_workers=0", "data.seq_len=32",
            "model.max_position_embeddings=32", "model.num_heads=4", "model.hidden_dropout=0",
            "model.attention_dropout=0", "train.global_batch_size=8", "train.micro_batch_size=2",
            "train.grad_clip=0.5", "optimizer.warmup_steps=1", "optimizer.lr=0.01", "train.eval_interval=0",
            "data.valid_fraction=0.02", "checkpoint.interval=0", "optimizer.name=lamb",
            "optimizer.schedule=constant", *overrides]


def reseeded(runs: dict) -> dict:
    return {name: [*run, "seed=99"] for name, run in runs.items()}


ENCODER_DECODERS = {  # family: (preset and data fixture, settings): T5 with dropout on; BART without, so that
    # its runs under two layouts can end alike
    "t5": ("t5-tiny", "t5_data", ()),
    "bart": ("bart-tiny", "train_data", ("model.max_position_embeddings=34", "model.hidden_dropout=0",
                                         "model.attention_dropout=0")),
}


def killed_runs(data: dict) -> dict:
    """The runs that the tests below kill and resume on 2 processes, by name; `data`: {fixture name: dataset}."""
    two_by_one = ["data.num_workers=0", "train.global_batch_size=8", "train.micro_batch_size=2",
                  "optimizer.warmup_steps=2", "train.eval_interval=0", "train.steps=8", "checkpoint.keep=0",
                  "checkpoint.interval=4", "train.log_interval=100"]
    runs = {"between": bert(data["train_data"], "zero.stage=2", "checkpoint.interval=4"),
            "during-save": bert(data["train_data"], "zero.stage=3", "checkpoint.interval=1"),
            "memory": ["xlnet-tiny", f"data.path={data['train_data']}", *two_by_one, "data.seq_len=32",
                       "model.mem_len=24", "model.reuse_len=16", "xlnet.perm_size=0", "model.hidden_dropout=0",
                       "model.attention_dropout=0", "data.valid_fraction=0.02"],
            "elmo": ["elmo-tiny", f"data.path={data['words_data']}", *two_by_one, "data.seq_len=16",
                     "data.valid_fraction=0.05", "parallel.tp=2", "zero.stage=2"]}
    for family, (preset, fixture, settings) in ENCODER_DECODERS.items():
        runs[family] = [preset, f"data.path={data[fixture]}", *two_by_one, "data.seq_len=32",
                        "data.valid_fraction=0.02", "parallel.tp=2", "zero.stage=2", *settings]
    return runs


@pytest.fixture(scope="module")
def killed(train_data, t5_data, words_data) -> dict:
    return killed_runs({"train_data": train_data, "t5_data": t5_data, "words_data": words_data})


@pytest.fixture(scope="module")
def straight(killed, tmp_path_factory):
    """Every run of `killed` uninterrupted, in one launch (one start-up of 2 processes for all); their directory."""
    out = tmp_path_factory.mktemp("straight")
    launch(out, killed, nproc=2)
    return out


def killed_at_step_4_and_resumed(tmp_path, straight, killed: dict, name: str) -> tuple:
    """The run `name` of `killed` SIGKILLed after its step-4 checkpoint then restarted with seed 99; returns its
    uninterrupted run's directory and the restarted run's (which resumed at step 4)."""
    run = {"run": killed[name]}
    proc = start(tmp_path / "killed", run, nproc=2)
    kill_when(proc, lambda: latest_step(tmp_path / "killed" / "run") == 4)
    launch(tmp_path / "killed", reseeded(run), nproc=2)
    assert summary(tmp_path / "killed" / "run")["resumed_from"]["step"] == 4
    return straight / name, tmp_path / "killed" / "run"


# ---- resumes that would fail if the checkpoint were ignored -------------------------------------------------

def test_sigkill_between_checkpoints_then_resume_with_another_seed_is_exact(straight, killed, tmp_path):
    """ZeRO-2, DP=2: killed after the step-4 checkpoint, restarted with seed 99: the checkpoint's seed, data
    position and RNG states win, so losses and weights and moments end bit-identical to a run that never stopped;
    the restart says where it resumed, in its log and its summary."""
    run = {"run": killed["between"]}
    proc = start(tmp_path / "killed", run, nproc=2)
    kill_when(proc, lambda: latest_step(tmp_path / "killed" / "run") == 4)
    assert latest_step(tmp_path / "killed" / "run") == 4
    restart = launch(tmp_path / "killed", reseeded(run), nproc=2)
    uninterrupted, resumed = straight / "between", tmp_path / "killed" / "run"
    assert "resumed from step 4 (samples 32)" in restart.stderr
    assert "seed 1234 from" in restart.stderr
    assert summary(resumed)["resumed_from"]["step"] == 4 and summary(resumed)["trained_steps"] == 8
    assert losses_by_step(uninterrupted) == losses_by_step(resumed)
    assert_same_checkpoints(uninterrupted, resumed)


def test_kill_during_a_save_resumes_the_previous_checkpoint(straight, killed, tmp_path):
    """ZeRO-3, DP=2, a checkpoint every step: SIGKILL while one is being written leaves it invisible (no `latest`
    pointing at it, no complete directory under its name); the restart (seed 99) resumes the one before, ends
    exact."""
    run = {"run": killed["during-save"]}
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
    launch(tmp_path / "killed", reseeded(run), nproc=2)
    assert summary(tmp_path / "killed" / "run")["resumed_from"]["step"] == resumed_from
    assert not any(p.name.endswith(".tmp") for p in folder.iterdir())
    assert_same_checkpoints(straight / "during-save", tmp_path / "killed" / "run")


def test_layout_change_and_a_resharded_tp4_checkpoint_train_on(train_data, tmp_path):
    """A TP=2 x DP=2 ZeRO-3 checkpoint at step 3: consolidated by one process it holds the same tensors, exported to
    HF its logits are the training model's; resumed (seed 99) as TP=1 x DP=2 under ZeRO-1, and resharded to TP=4
    and resumed (seed 99) as TP=4 x DP=1, both end within 1e-5 of one process that never changed layout (weights,
    and LAMB's moments within 1e-4: the optimizer state survived)."""
    launch(tmp_path, {"ref": gpt2(train_data, "train.steps=6", "zero.stage=1")}, nproc=1)
    launch(tmp_path, {"moved": gpt2(train_data, "train.steps=3", "parallel.tp=2", "zero.stage=3")})
    ckpt = C.resolve(str(tmp_path / "moved"))
    assert len(os.listdir(os.path.join(ckpt, "shards"))) == 3 * 4  # 3 kinds x (2 TP x 2 ZeRO-3 partitions)
    consolidated_and_exported(ckpt, tmp_path)
    call_cli("checkpoints_tools", "reshard", tmp_path / "moved", "--tp", "4",
             "--out", tmp_path / "tp4" / "checkpoints" / "step_00000003")
    tp4 = C.Pieces(str(tmp_path / "tp4" / "checkpoints" / "step_00000003"))
    assert tp4.tp == 4 and all(torch.equal(tp4.full("exp_avg", n), C.Pieces(ckpt).full("exp_avg", n)) for n in tp4.params)
    C.mark_latest(str(tmp_path / "tp4"), "step_00000003")
    launch(tmp_path, reseeded({"moved": gpt2(train_data, "train.steps=6", "zero.stage=1"),
                               "tp4": gpt2(train_data, "train.steps=6", "parallel.tp=4", "zero.stage=1")}))
    ref = C.Pieces(C.resolve(str(tmp_path / "ref")))
    for run, layout in (("moved", (1, 4)), ("tp4", (4, 1))):
        assert summary(tmp_path / run)["resumed_from"]["step"] == 3
        assert (summary(tmp_path / run)["layout"]["tp"], summary(tmp_path / run)["layout"]["dp"]) == layout
        assert max_rel_diff(weights(tmp_path / run), weights(tmp_path / "ref")) < 1e-5, run
        mine = C.Pieces(C.resolve(str(tmp_path / run)))
        for kind in ("exp_avg", "exp_avg_sq"):
            a, b = ({n: p.full(kind, n) for n in p.params} for p in (mine, ref))
            assert max_rel_diff(a, b) < 1e-4, (run, kind)


def consolidated_and_exported(ckpt: str, tmp_path) -> None:
    """`consolidate` joins every piece into whole tensors; `to-hf` writes a GPT2LMHeadModel with the same logits."""
    import transformers
    from safetensors.torch import load_file

    from pretrain.models.model import Pretraining
    from pretrain.parallel import mcore

    call_cli("checkpoints_tools", "consolidate", ckpt, "--out", tmp_path / "whole")
    whole = load_file(tmp_path / "whole" / "shards" / "param-tp00-dp000.safetensors")
    full = C.load_full_model(ckpt)
    assert whole.keys() == {f"{k}@0" for k in full} and all(torch.equal(whole[f"{k}@0"], v) for k, v in full.items())
    call_cli("checkpoints_tools", "to-hf", ckpt, "--out", tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    mcore.initialize(1, 0)
    cfg = C.model_config(C.read_meta(ckpt))
    ours = Pretraining(cfg).eval()
    ours.load_state_dict(full, strict=False)
    ids = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids)["logits"][..., :cfg.vocab_size], rtol=1e-5, atol=1e-5)


# ---- precision x ZeRO x optimizer -------------------------------------------------------------------------

MATRIX = {f"{precision}-z{stage}-{opt}": (precision, stage, opt, False)
          for precision in ("fp32", "bf16", "fp16") for stage in (0, 1, 2, 3) for opt in ("adamw", "lamb")}
MATRIX.update({f"{precision}-z{stage}-lamb-offload": (precision, stage, "lamb", True)
               for precision in ("fp32", "bf16", "fp16") for stage in (2, 3)})


FP16_OVERFLOW = ("fp16.initial_scale_power=18", "fp16.hysteresis=1")  # overflows before the checkpoint at step 2


@pytest.fixture(scope="module")
def matrix(train_data, tmp_path_factory):
    """Every combination trained 3 steps on DP=2 (dropout on, checkpoint at step 2); tests/engine_worker.py copies
    the step-2 checkpoint to NAME-resume-again and resumes it with another seed."""
    out = tmp_path_factory.mktemp("matrix")
    runs = {}
    for name, (precision, stage, opt, offload) in MATRIX.items():
        runs[f"{name}-resume"] = bert(train_data, f"precision={precision}", f"zero.stage={stage}",
                                      f"optimizer.name={opt}", f"zero.offload={str(offload).lower()}", "train.steps=3",
                                      "checkpoint.interval=2", "optimizer.warmup_steps=1",
                                      *(["grad_accum_dtype=bf16"] if (precision, stage) == ("bf16", 0) else []),
                                      *(FP16_OVERFLOW if precision == "fp16" else []),
                                      *(["train.deterministic=true"] if name == "fp32-z1-adamw" else []))
    runs["ernie2-resume"] = ["ernie-tiny", f"data.path={train_data}", "data.num_workers=0", "data.seq_len=32",
                             "model.max_position_embeddings=32", "train.global_batch_size=8",
                             "train.micro_batch_size=2",
                             "optimizer.warmup_steps=1", "train.eval_interval=0", "train.steps=4", "zero.stage=2",
                             "checkpoint.interval=2", "checkpoint.keep=0",
                             "ernie.stages=" + json.dumps(ERNIE_STAGES)]
    launch(out, runs, nproc=2)
    return out


ERNIE_STAGES = [{"steps": 2, "tasks": {"knowledge_masking": 1, "capitalization": 1}},
                {"steps": 2, "tasks": {"knowledge_masking": 1, "capitalization": 1, "sentence_distance": 1}}]


def test_ernie2_heads_that_join_after_a_resume_count_their_steps_from_their_first(matrix):
    """ZeRO-2, DP=2, resumed at the stage boundary: the checkpoint holds how many steps each head sat idle (by name:
    any layout reads it), so the head that joins after the resume takes a first Adam step (bias correction of step 1,
    not 3) as in the straight run: bit-identical weights and moments."""
    straight, again = matrix / "ernie2-resume", matrix / "ernie2-resume-again"
    assert summary(again)["resumed_from"]["step"] == 2
    idle = torch.load(straight / "checkpoints" / "step_00000002" / "trainer.pt", weights_only=False)["idle_steps"]
    assert idle["tasks.sequence.sentence_distance.weight"] == 2 and "tasks.token.capitalization.weight" not in idle
    assert_same_checkpoints(straight, again)


@pytest.mark.parametrize("name", MATRIX)
def test_precision_zero_optimizer_matrix_resumes_exactly(matrix, name):
    """The optimizer's step count equals the applied updates (DeepSpeed's unfused fp16/bf16 wrapper steps once when
    it is built: undone), fp16's loss scale is saved and restored whatever wrapper holds it, and the resumed run ends
    bit-identical (weights, moments) to the straight one."""
    precision, stage, _, _ = MATRIX[name]
    straight, again = matrix / f"{name}-resume", matrix / f"{name}-resume-again"
    for run in (straight, again):
        f = facts(run)
        assert f["optimizer_steps"] == [3 - f["skipped_steps"]], f
    assert summary(again)["resumed_from"]["step"] == 2
    assert_same_checkpoints(straight, again)
    scale = [torch.load(os.path.join(C.resolve(str(r)), "trainer.pt"), weights_only=False)["loss_scaler"]
             for r in (straight, again)]
    assert scale[0] == scale[1]
    assert losses_by_step(again)[3] == losses_by_step(straight)[3]  # the resumed step itself, same loss
    if precision == "fp16":  # the scale an overflow lowered, not the configured one, is what the resume goes on with
        skipped, scales = losses_by_step(straight, "skipped_steps"), losses_by_step(straight, "loss_scale")
        assert skipped[2] >= 1 and scales[2] < 2.0 ** 18, (skipped, scales)
        assert losses_by_step(again, "loss_scale")[3] == scales[3]
        assert losses_by_step(again, "skipped_steps")[3] == skipped[3] < 3
        assert facts(again)["loss_scale"] == facts(straight)["loss_scale"]
    expected = {("fp16", 0): "FP16_UnfusedOptimizer", ("bf16", 0): "FP16_UnfusedOptimizer",
                ("bf16", 1): "BF16_Optimizer" if "offload" not in name else "DeepSpeedZeroOptimizer"}
    if (precision, stage) in expected:
        assert facts(straight)["wrapper"] == expected[precision, stage]
    assert facts(straight)["deterministic"] == (name == "fp32-z1-adamw")


@pytest.mark.parametrize("name", MATRIX)
def test_gradients_are_reduced_in_the_dtype_they_accumulate_in(matrix, name):
    """DeepSpeed reduces gradients in its communication_data_type (default: the model's dtype) whatever it
    accumulates them in: bf16 with fp32 accumulation (every stage but 0) must send fp32, fp16 sends fp16."""
    precision, stage, _, _ = MATRIX[name]
    expected = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16" if stage == 0 else "float32"}[precision]
    assert facts(matrix / f"{name}-resume")["reduced_dtypes"] == [expected]


# ---- refusing what does not fit ---------------------------------------------------------------------------

def test_a_checkpoint_from_before_model_features_resumes_as_its_arch():
    """Checkpoints written before the model section named its features (norm, heads, ...) take their arch's; a
    run whose features differ from those is refused like any other model change."""
    import dataclasses

    from pretrain.config import load
    from pretrain.models.config import FEATURES

    cfg = load("gpt2-tiny")
    cfg.model.vocab_size = 100
    identity = {"tokenizer_sha256": "a", "vocab_size": 100, "objective": "clm", "datasets": [], "seed": cfg.seed}
    old = {k: v for k, v in dataclasses.asdict(cfg.model).items() if k not in FEATURES}
    meta = {"model": old, "run": identity}
    assert resume_mismatches("ckpt", meta, cfg, identity) == []
    cfg.model.norm = "post"
    assert "model.norm='post' (checkpoint: 'pre')" in resume_mismatches("ckpt", meta, cfg, identity)[0]
    cfg.model.norm, cfg.model.vocab_size = "pre", 108  # a vocabulary of 8 more (sentinels): said once
    odd = resume_mismatches("ckpt", meta, cfg, {**identity, "vocab_size": 108})[0]
    assert "model.vocab_size=108 (checkpoint: 100)" in odd and "vocabulary size" not in odd
    odd = resume_mismatches("ckpt", meta, cfg, {**identity, "vocab_size": 104})[0]  # the dataset's is another
    assert "model.vocab_size=108 (checkpoint: 100)" in odd and "vocabulary size 104 (checkpoint: 100)" in odd


@pytest.fixture(scope="module")
def trained_bert(train_data, tmp_path_factory):
    """A finished 2-step bert-tiny run (one process)."""
    from pretrain.train import train

    out = tmp_path_factory.mktemp("trained_bert") / "run"
    train(config(bert(train_data, "train.steps=2", "checkpoint.interval=0", f"out_dir={out}")))
    return out


def copy_run(src, dst):
    shutil.copytree(src, dst)
    return dst


def train_cli(*overrides, config_name="bert-tiny"):
    proc = run_cli("pretrain", "train", "--config", config_name, "--set", *overrides, check=False)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("pretrain: error")]
    return proc, lines


def test_resume_refuses_another_model_objective_tokenizer_or_dataset(trained_bert, train_data, corpus, gpt2_vocab,
                                                                      sp_model, tmp_path):
    from helpers import quick_build

    out = copy_run(trained_bert, tmp_path / "run")
    base = bert(train_data, "train.steps=4", f"out_dir={out}")[1:]
    proc, lines = train_cli(*base, "model.hidden_size=64", "model.num_heads=2")
    assert proc.returncode == 2 and len(lines) == 1 and "model.hidden_size=64 (checkpoint: 128)" in lines[0], proc.stderr
    proc, lines = train_cli(*base, "data.objective=mlm_sop")
    assert len(lines) == 1 and "data.objective=mlm_sop (checkpoint: mlm_nsp)" in lines[0], proc.stderr
    other_tokenizer = tmp_path / "bpe"
    quick_build([os.path.join(corpus["dir"], "en.jsonl")], other_tokenizer, tokenizer=gpt2_vocab)
    proc, lines = train_cli(*base, f"data.path={other_tokenizer}")
    assert len(lines) == 1 and "tokenizer sha256" in lines[0], proc.stderr
    assert re.search(r"model.vocab_size=\d+ \(checkpoint: \d+\)", lines[0]) and "vocabulary size" not in lines[0]
    proc, lines = train_cli(*base, f"data.path={other_tokenizer}", "model.vocab_size=0", f"out_dir={tmp_path / 'new'}")
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "tokenizer has no " in lines[0] and "mask" in lines[0], lines  # (GPT-2's BPE: no [MASK] to mask with)
    other_data = tmp_path / "other"
    quick_build([os.path.join(corpus["dir"], "en.jsonl")], other_data, tokenizer=sp_model)
    proc, lines = train_cli(*base, f"data.path={other_data}")
    assert len(lines) == 1 and "checkpoint.allow_dataset_change=true" in lines[0], proc.stderr
    # allowed, with a longer warmup: from its first step the resumed run follows its own schedule, not the lr the
    # checkpoint's schedule had reached (the full 2e-3 after a warmup of 2)
    proc, _ = train_cli(*base, f"data.path={other_data}", "checkpoint.allow_dataset_change=true",
                        "optimizer.warmup_steps=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary(out)["resumed_from"]["step"] == 2 and summary(out)["steps"] == 4
    assert losses_by_step(out, "lr") == pytest.approx({1: 0.0, 2: 1e-3, 3: 1e-3, 4: 1.5e-3})


def test_init_from_takes_unset_sizes_and_names_each_disagreement(trained_bert, train_data, corpus, wordpiece_vocab,
                                                                  tmp_path):
    from helpers import quick_build

    settings = bert(train_data, "train.steps=2", f"checkpoint.init_from={trained_bert}")[1:]
    unsized = tmp_path / "unsized.yaml"  # no model sizes: BERT-base defaults, which the checkpoint overrides
    unsized.write_text("model: {arch: bert, hidden_dropout: 0.0}\n")
    proc, _ = train_cli(*settings, f"out_dir={tmp_path / 'a'}", config_name=str(unsized))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "model sizes from" in proc.stderr and "hidden_size=128" in proc.stderr
    meta = C.read_meta(C.resolve(str(tmp_path / "a")))
    assert meta["model"]["hidden_size"] == 128 and meta["model"]["num_layers"] == 2
    proc, lines = train_cli(*settings, f"out_dir={tmp_path / 'b'}", config_name="bert-base")
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "model.hidden_size=768 (checkpoint: 128)" in lines[0] and "model.num_layers=12 (checkpoint: 2)" in lines[0]
    assert "size mismatch" not in proc.stderr
    # SpanBERT (heads: [mlm]) from BERT's weights: the NSP head and pooler are left out, the SBO head starts fresh
    proc, _ = train_cli(*settings, f"out_dir={tmp_path / 'span'}", config_name="spanbert-tiny")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "left out its nsp, pooler; new, initialised: sbo" in proc.stderr
    wp = tmp_path / "wp"
    quick_build([os.path.join(corpus["dir"], "en.jsonl")], wp, tokenizer=wordpiece_vocab)
    proc, lines = train_cli(*settings, f"data.path={wp}", "model.vocab_size=0", f"out_dir={tmp_path / 'c'}")
    assert proc.returncode == 2 and len(lines) == 1 and "another tokenizer" in lines[0], proc.stderr


def test_tp3_on_two_processes_is_one_line_printed_once(train_data, tmp_path):
    """Under `ptm launch torchrun`, without torchrun's ChildFailedError traceback: the ranks' status, 2."""
    cmd = [sys.executable, "-m", "launchers", "torchrun", "--nproc_per_node", "2", f"--master_port={free_port()}",
           "-m", "pretrain", "train", "--config", "bert-tiny", "--set", *bert(train_data, "parallel.tp=3")[1:],
           f"out_dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if "pretrain: error" in line]
    assert proc.returncode == 2 and len(lines) == 1 and "launchers:" not in proc.stderr, proc.stderr[-3000:]
    assert "parallel.tp=3 does not divide the 2 processes" in lines[0]
    assert "Traceback" not in proc.stderr and "megatron" not in proc.stderr


def test_a_damaged_dataset_stops_training_before_step_0(train_data, tmp_path):
    data = shutil.copytree(train_data, tmp_path / "data")
    shard = sorted(data.glob("*.arrow"))[0]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    proc, lines = train_cli(*bert(str(data), f"out_dir={tmp_path / 'run'}")[1:])
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert shard.name in lines[0] and "python -m data_prep verify" in lines[0]
    assert not (tmp_path / "run" / "checkpoints").exists()


# ---- damaged checkpoints, pruning, durability ------------------------------------------------------------------

def damage(ckpt, how: str) -> str:
    """Damage a checkpoint the way disks and crashes do; returns the file that was damaged."""
    shard = sorted((ckpt / "shards").iterdir())[0]
    if how == "truncated":
        with open(shard, "r+b") as f:
            f.truncate(shard.stat().st_size - 100)
    elif how == "corrupted":
        data = bytearray(shard.read_bytes())
        data[-50] ^= 0xFF  # a flipped byte inside a tensor: same size, valid header
        shard.write_bytes(bytes(data))
    elif how == "missing":
        shard.unlink()
    else:
        shard = ckpt / "meta.json"
        shard.write_text("{ not json")
    return shard.name


@pytest.mark.parametrize("how", ["truncated", "corrupted", "missing", "unreadable meta"])
def test_a_damaged_latest_falls_back_to_the_newest_complete_checkpoint(train_data, tmp_path, how):
    """`latest` names a damaged step_4: the restart warns with the file and the reason, sets it aside, resumes
    step_2 and trains on; a checkpoint tool reading the damaged one names the file in one line. Damaged again, the
    step_4 trained again is set aside under the next free name."""
    from pretrain.train import train

    run = lambda *more: config(bert(train_data, "checkpoint.interval=2", f"out_dir={tmp_path}", *more))  # noqa: E731
    train(run("train.steps=4"))
    bad = tmp_path / "checkpoints" / "step_00000004"
    name = damage(bad, how)
    proc = run_cli("checkpoints_tools", "consolidate", bad, "--out", tmp_path / "whole", check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1 and name in lines[0], proc.stderr
    proc, _ = train_cli(*bert(train_data, "checkpoint.interval=2", f"out_dir={tmp_path}", "train.steps=6",
                              "optimizer.warmup_steps=1")[1:])  # another schedule: the run says so
    assert proc.returncode == 0, proc.stderr[-3000:]
    warning = next(line for line in proc.stderr.splitlines() if "warning" in line)
    assert "step_00000004 is damaged" in warning and name in warning and "resuming from" in warning
    assert re.search(r"the learning rate of step 3 is \S+ by this config's schedule, \S+ by the checkpoint's",
                     proc.stderr), proc.stderr[-3000:]
    assert summary(tmp_path)["resumed_from"]["step"] == 2
    assert (tmp_path / "checkpoints" / "damaged-step_00000004").is_dir() and latest_step(tmp_path) == 6
    for step in (4, 6):  # step_4, trained again, is damaged again: damaged-step_00000004 is taken
        damage(tmp_path / "checkpoints" / f"step_{step:08d}", how)
    assert Checkpoints(str(tmp_path), 0).newest_complete() == str(tmp_path / "checkpoints" / "step_00000002")
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["damaged-step_00000004", "damaged-step_00000004.1",
                                                            "damaged-step_00000006", "latest", "step_00000002"]
    assert latest_step(tmp_path) == 2


def test_every_checkpoint_damaged_is_an_error_not_a_fresh_start(train_data, tmp_path):
    from pretrain.train import train

    train(config(bert(train_data, "checkpoint.interval=2", "train.steps=4", f"out_dir={tmp_path}")))
    for step in (2, 4):
        damage(tmp_path / "checkpoints" / f"step_{step:08d}", "truncated")
    proc, lines = train_cli(*bert(train_data, "train.steps=6", f"out_dir={tmp_path}")[1:])
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "no complete checkpoint" in lines[0] and "step_00000002" in lines[0] and "step_00000004" in lines[0]


def test_keep_prunes_old_checkpoints_but_never_the_one_latest_names(train_data, tmp_path):
    from pretrain.train import train

    train(config(bert(train_data, "checkpoint.interval=1", "checkpoint.keep=2", "train.steps=5", f"out_dir={tmp_path}")))
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step_00000004", "step_00000005"]
    C.mark_latest(str(tmp_path), "step_00000004")  # e.g. a resume fell back to it; step_5 is newer
    for step in (6, 7):
        shutil.copytree(folder / "step_00000005", folder / f"step_{step:08d}")
    Checkpoints(str(tmp_path), keep=2).prune()
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step_00000004", "step_00000006", "step_00000007"]


def test_checkpoint_files_and_directories_reach_the_disk_before_latest_moves(train_data, tmp_path, monkeypatch):
    """Every file of the checkpoint and every directory on its path is fsynced before `latest` is rewritten."""
    import pretrain.checkpoint_manager as ckpt_module
    from pretrain.train import train

    synced, order = set(), []
    real_fsync = os.fsync

    def fsync(fd):  # small files are written as NAME.tmpPID, fsynced, then renamed (ptm/files.py)
        synced.add(re.sub(r"\.tmp\d+$", "", os.path.realpath(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_fsync(fd)

    real_mark = ckpt_module.mark_latest

    def mark(out_dir, name):
        final = os.path.realpath(os.path.join(out_dir, "checkpoints", name))
        files = [os.path.join(d, f) for d, _, fs in os.walk(final) for f in fs]
        dirs = [d for d, _, _ in os.walk(final)]
        # files were synced under the temporary name the directory had while being written
        tmp = os.path.join(os.path.dirname(final), f".{name}.tmp")
        unsynced = [p for p in files if p not in synced and p.replace(final, tmp, 1) not in synced]
        unsynced += [d for d in dirs + [os.path.dirname(final)] if d not in synced and d.replace(final, tmp, 1) not in synced]
        order.append(unsynced)
        return real_mark(out_dir, name)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(ckpt_module, "mark_latest", mark)
    train(config(bert(train_data, "checkpoint.interval=1", "train.steps=2", f"out_dir={tmp_path}")))
    assert order == [[], []]
    meta = C.read_meta(C.resolve(str(tmp_path)))
    assert {"trainer.pt", "config.yaml", "rng/rank00000.pt"} <= meta["files"].keys()


def test_a_checkpoint_the_disk_refuses_ends_every_rank_in_one_line_and_keeps_the_last(trained_bert, train_data,
                                                                                       tmp_path):
    """A checkpoint write the system refuses (here files over RLIMIT_FSIZE: EFBIG, as a full disk's ENOSPC or a
    quota's EDQUOT) ends both ranks together with exit 2 and one line naming the checkpoint, the error and the fix,
    without a traceback; what it wrote is removed, and what a crash left before it too; the last checkpoint is
    untouched and `latest` still names it. A log row refused before it is a warning, once: rank 0 alone does not end
    in a traceback."""
    import resource

    run = copy_run(trained_bert, tmp_path / "run")
    stale = run / "checkpoints" / ".step_00000001.tmp" / "shards"  # (a write cut short by a crash)
    stale.mkdir(parents=True)
    (stale / "param-tp00-dp000.safetensors.tmp").write_bytes(b"x" * 1000)
    limit = 256 << 10  # below a shard of bert-tiny's (MBs), above every other file the run writes
    with open(run / "metrics.jsonl", "a") as f:  # but this one (a row of a step before the checkpoint, which the
        f.write(json.dumps({"step": 1, "filler": " " * limit}) + "\n")  # resume keeps): its next row is refused

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    cmd = [sys.executable, "-m", "launchers", "torchrun", "--nproc_per_node", "2", f"--master_port={free_port()}",
           "-m", "pretrain", "train", "--config", "bert-tiny", "--set",
           *bert(train_data, "train.steps=3", "checkpoint.interval=1", f"out_dir={run}", "checkpoint.keep=2")[1:]]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=small_files)
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[0].startswith("pretrain: error: cannot write checkpoint step_00000003 in ") and all(
        s in lines[0] for s in ("File too large", "step_00000002, the last checkpoint, is untouched",
                                "; free space there (a save needs room for one checkpoint more than the "
                                "checkpoint.keep=2 kept: an older step_N can go) or raise the quota and re-run the same "
                                "command")), lines[0]
    assert json.load(open(run / "failed.json")) == {"error": lines[0], "exception": "CheckpointError", "exit": 2}
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_00000002"]
    assert C.resolve(str(run)).endswith("step_00000002") and C.verify(C.resolve(str(run))) is None
    assert proc.stderr.count(f"pretrain: warning: cannot write {run}/metrics.jsonl: File too large; the run goes on"
                             ) == 1, proc.stderr[-3000:]


def test_a_memory_resumes_exactly_and_re_splits_for_another_layout(straight, killed, tmp_path):
    """XLNet with a memory carried along streams (reuse_len 16 of 32, mem_len 24) at DP=2: killed after the step-4
    checkpoint and restarted with seed 99, it ends bit-identical to a run that never stopped: the checkpoint holds each
    stream's memory (memory/dpDDD.safetensors; a restart without it would attend to none at step 5). The step-8
    checkpoints resumed as TP=2 x DP=1 (the streams of two files on one data-parallel rank) and as DP=2 end within
    1e-5 of each other."""
    uninterrupted, resumed = killed_at_step_4_and_resumed(tmp_path, straight, killed, "memory")
    assert sorted(os.listdir(os.path.join(C.resolve(str(resumed)), "memory"))) == ["dp000.safetensors",
                                                                                   "dp001.safetensors"]
    assert losses_by_step(uninterrupted, "lm_loss") == losses_by_step(resumed, "lm_loss")
    assert_same_checkpoints(uninterrupted, resumed)
    for name, source in (("tp2", uninterrupted), ("dp2", resumed)):
        shutil.copytree(source, tmp_path / "moved" / name)
    run = killed["memory"]
    moved = {"tp2": [*run, "train.steps=10", "parallel.tp=2"], "dp2": [*run, "train.steps=10"]}
    launch(tmp_path / "moved", reseeded(moved), nproc=2)
    assert summary(tmp_path / "moved" / "tp2")["layout"]["dp"] == 1
    assert max_rel_diff(weights(tmp_path / "moved" / "tp2"), weights(tmp_path / "moved" / "dp2"), 2) < 1e-5


def resumed_exactly_and_resharded(tmp_path, straight, killed: dict, name: str, loss: str) -> tuple:
    """`killed_at_step_4_and_resumed`, checked: the same `loss` every step and the same checkpoints bit for bit; the
    uninterrupted run's checkpoint resharded to one rank holds the same whole tensors. Returns (uninterrupted run,
    resumed run, the first's checkpoint, its whole weights)."""
    uninterrupted, resumed = killed_at_step_4_and_resumed(tmp_path, straight, killed, name)
    assert losses_by_step(uninterrupted, loss) == losses_by_step(resumed, loss)
    assert_same_checkpoints(uninterrupted, resumed)
    ckpt = C.resolve(str(uninterrupted))
    call_cli("checkpoints_tools", "reshard", uninterrupted, "--tp", "1", "--out", tmp_path / "tp1")
    full, one = C.load_full_model(ckpt), C.load_full_model(str(tmp_path / "tp1"))
    assert full.keys() == one.keys() and all(torch.equal(full[k], one[k]) for k in full)
    return uninterrupted, resumed, ckpt, full


def test_elmo_resumes_exactly_at_tp2_and_its_checkpoint_reshards_and_exports(straight, killed, tmp_path):
    """ELMo at TP=2 (the softmax split, the LSTMs replicated) under ZeRO-2, dropout on: killed after the step-4
    checkpoint and restarted with seed 99, it ends bit-identical to a run that never stopped; the TP=2 checkpoint,
    resharded to one rank, holds the same whole tensors, and its ELMo files (to-elmo) import back to them."""
    _, _, ckpt, full = resumed_exactly_and_resharded(tmp_path, straight, killed, "elmo", "fwd_loss")
    call_cli("checkpoints_tools", "to-elmo", ckpt, "--out", tmp_path / "elmo")
    call_cli("checkpoints_tools", "from-elmo", tmp_path / "elmo", "--out", tmp_path / "imported")
    back, vocab = C.load_full_model(str(tmp_path / "imported")), C.model_config(C.read_meta(ckpt)).vocab_size
    assert all(torch.equal(back[k], full[k][:vocab] if k.startswith("softmax.") else full[k]) for k in full)


@pytest.mark.parametrize("family", ENCODER_DECODERS)
def test_an_encoder_decoder_resumes_exactly_and_its_tp2_checkpoint_reshards_and_exports(family, straight, killed,
                                                                                         tmp_path):
    """T5 (span corruption, dropout on) and BART (denoising) at TP=2 under ZeRO-2: killed after the step-4 checkpoint
    and restarted with seed 99, each ends bit-identical to a run that never stopped (the decoder's stack, its
    cross-attention and T5's bucketed bias tables split by heads included); that run's TP=2 checkpoint, resharded to
    one rank or consolidated, holds the same whole tensors, and its HF export computes ptm's logits. BART's step-8 checkpoint resumed
    as TP=1 x DP=2 (seed 99) ends within 1e-5 of the TP=2 run resumed beside it: a layout change on resume."""
    from safetensors.torch import load_file

    from pretrain import models
    from pretrain.families import get
    from pretrain.parallel import mcore

    uninterrupted, resumed, ckpt, full = resumed_exactly_and_resharded(tmp_path, straight, killed, family, "lm_loss")
    call_cli("checkpoints_tools", "consolidate", ckpt, "--out", tmp_path / "whole")
    whole = load_file(tmp_path / "whole" / "shards" / "param-tp00-dp000.safetensors")
    assert whole.keys() == {f"{k}@0" for k in full} and all(torch.equal(whole[f"{k}@0"], v) for k, v in full.items())
    if family == "t5":
        assert full["encoder.bias.weight"].shape == (32, 2)  # the bias table whole again: 32 buckets x 2 heads
    call_cli("checkpoints_tools", "to-hf", ckpt, "--out", tmp_path / "hf")
    adapter = get(family).adapter
    hf = adapter.hf_model_class(adapter.hf_class).from_pretrained(tmp_path / "hf").eval()
    mcore.initialize(1, 0)
    cfg = C.model_config(C.read_meta(ckpt))
    ours = models.build(cfg).eval()
    ours.load_state_dict(full, strict=False)
    g = torch.Generator().manual_seed(0)
    ids, dec = torch.randint(4, cfg.vocab_size, (2, 16), generator=g), torch.randint(4, cfg.vocab_size, (2, 5), generator=g)
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids, decoder_input_ids=dec).logits,
                                   ours(ids, decoder_input_ids=dec)["logits"][..., :cfg.vocab_size], rtol=1e-5, atol=1e-5)
    if family == "bart":
        for name, source in (("tp1", uninterrupted), ("tp2", resumed)):
            shutil.copytree(source, tmp_path / "moved" / name)
        run = killed[family]
        moved = {"tp1": [*run, "train.steps=10", "parallel.tp=1"], "tp2": [*run, "train.steps=10"]}
        launch(tmp_path / "moved", reseeded(moved), nproc=2)
        for name, tp in (("tp1", 1), ("tp2", 2)):
            assert summary(tmp_path / "moved" / name)["resumed_from"]["step"] == 8
            assert summary(tmp_path / "moved" / name)["layout"]["tp"] == tp
        assert max_rel_diff(weights(tmp_path / "moved" / "tp1"), weights(tmp_path / "moved" / "tp2")) < 1e-5
