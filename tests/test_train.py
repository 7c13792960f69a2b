"""Training: resume is exact, bad configs fail early, GPT-2 and the ERNIE 2.0 schedule train.
(Sample determinism, rank disjointness and masking are tested in tests/test_data_*.py.)"""
import contextlib
import io
import json
import re
import time

import pytest
import torch

from conftest import read_jsonl, run_cli
from helpers import quick_build
from data_prep.dataset import Corpus
from pretrain.config import load


@pytest.fixture(scope="module")
def dataset(train_data):
    return train_data


def _cfg(dataset, *overrides, preset="bert-tiny"):
    return load(preset, [f"data.path={dataset}", "data.num_workers=0", "data.seq_len=32",
                         "model.max_position_embeddings=32", "train.global_batch_size=8", "train.micro_batch_size=4",
                         "optimizer.warmup_steps=2", "train.eval_interval=0", "model.hidden_dropout=0.1",
                         "data.valid_fraction=0.02", *overrides])


def test_resume_is_exact(dataset, tmp_path, capfd):
    """A run stopped after step 3 (as if killed after its checkpoint) and restarted ends bit-identical to a
    run that never stopped: weights, optimizer moments, data position, validation loss."""
    from pretrain import checkpoint as C
    from pretrain.train import Trainer, train

    def cfg(out, *more):
        return _cfg(dataset, f"out_dir={out}", "train.steps=6", "checkpoint.interval=0", *more)

    straight = Trainer(cfg(tmp_path / "a")).fit()
    first = Trainer(cfg(tmp_path / "b"))
    micro = first._loader(first._sources(0)[0], 0, 0)
    for _ in range(3):
        first.train_step(micro)
    first.save()  # ...and the process dies here, having logged steps past its checkpoint
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(tmp_path / "b" / "tensorboard")) as planted:
        for step in range(1, 6):
            planted.add_scalar("train/loss", 99.0, step)
    (tmp_path / "b" / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 99.0}) + "\n"
                                                          for s in range(1, 6)) + '{"step": 6, "lo')  # (cut short)
    capfd.readouterr()
    resumed = Trainer(cfg(tmp_path / "b", "seed=99")).fit()  # the checkpoint's seed wins
    assert resumed["trained_steps"] == 3 and straight["trained_steps"] == 6 and resumed["resumed_from"]["step"] == 3
    err = capfd.readouterr().err  # the log, flushed on stderr: the last step's row shown whatever log_interval says
    assert "pretrain: the logs' rows past step 3 (3 of metrics.jsonl), of a run that stopped before its checkpoint" \
        in err and re.search(r"\npretrain: step 6/6: mlm_loss=.* elapsed=0:00:\d\d eta=0:00:00\n", err), err
    # the steps trained again replace those logged past the checkpoint, in metrics.jsonl and TensorBoard alike
    rows = read_jsonl(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6] and [r["loss"] for r in rows][:3] == [99.0] * 3
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(tmp_path / "b" / "tensorboard"))
    board.Reload()
    assert [(e.step, e.value == 99.0) for e in board.Scalars("train/loss")] == [
        (1, True), (2, True), (3, True), (4, False), (5, False), (6, False)]
    mine = [r["loss"] for r in read_jsonl(tmp_path / "a" / "metrics.jsonl")]
    assert straight["train_loss"] == pytest.approx(sum(mine) / 6, abs=1e-4)  # (the mean of the last 10 at most)
    ckpt = [C.Pieces(str(tmp_path / run / "checkpoints" / "step_00000006")) for run in ("a", "b")]
    for kind in C.KINDS:  # weights and both moments, bit for bit
        assert all(torch.equal(ckpt[0].full(kind, n), ckpt[1].full(kind, n)) for n in ckpt[0].params)
    assert ckpt[0].meta["consumed_samples"] == ckpt[1].meta["consumed_samples"] == 48
    assert straight["valid_mlm_loss"] == resumed["valid_mlm_loss"]
    recorded = {name: (tmp_path / "a" / name).read_bytes() for name in ("config.yaml", "summary.json")}
    for steps, where, batch in ((4, "past", 8), (6, "at", 16)):  # a re-run of a finished run: said; its record not
        past = train(cfg(tmp_path / "a", f"train.steps={steps}", "optimizer.lr=0.5",  # written over
                         f"train.global_batch_size={batch}"))
        assert past == json.loads(recorded["summary.json"]) and past["trained_steps"] == 6
        err = capfd.readouterr().err
        assert (f"pretrain: the checkpoint of step 6 ({tmp_path}/a/checkpoints/step_00000006) is {where} "
                f"train.steps={steps}: nothing to train") in err
        assert ("pretrain: train.global_batch_size 8 -> 16: an evaluation reads the first eval_steps global batches "
                "of the held-out samples, so its valid_* metrics from here on measure other samples" in err) == (
            batch == 16), err
        assert {name: (tmp_path / "a" / name).read_bytes() for name in recorded} == recorded
    (tmp_path / "a" / "summary.json").unlink()  # a run killed after its last checkpoint, before its summary: a re-run
    again = train(cfg(tmp_path / "a"))  # ends it as it would have ended (its evaluation, its summary)
    assert again["trained_steps"] == 0 and again["valid_mlm_loss"] == straight["valid_mlm_loss"]
    assert json.load(open(tmp_path / "a" / "summary.json")) == again


def test_a_loss_spike_is_rolled_back_and_its_steps_left_out(dataset, tmp_path, capfd, monkeypatch):
    """train.skip_steps: the steps named read and train nothing (no checkpoint nor evaluation falls on them), the
    data position and the learning rate move on past them: the next steps read the micro-batches and take the lr they
    would have. `ptm convert rollback` makes a run resume an earlier checkpoint of its own, the later ones and the logs'
    rows past it moved aside, not deleted; resumed there with the skip, it ends bit-identical to a run that skipped
    from the start. A range added at or before the checkpoint resumed is a warning."""
    from conftest import call_cli
    from pretrain import checkpoint as C
    from pretrain.train import Trainer, train

    def cfg(out, *more):
        return _cfg(dataset, f"out_dir={out}", "train.steps=6", "checkpoint.interval=2", "checkpoint.keep=0", *more)

    def ckpt(run, step):
        return C.Pieces(str(tmp_path / run / "checkpoints" / f"step_{step:08d}"))

    def same(a, b):
        return all(torch.equal(a.full(kind, n), b.full(kind, n)) for kind in C.KINDS for n in a.params)

    read, to_device = {}, Trainer._to_device  # the micro-batches each run trained on, by step

    def recorded(self, batch):
        if self.model.training:  # (not an evaluation's)
            read.setdefault(self.cfg.out_dir, {}).setdefault(self.step + 1, []).append(batch["input_ids"].clone())
        return to_device(self, batch)

    monkeypatch.setattr(Trainer, "_to_device", recorded)
    spiked = train(cfg(tmp_path / "spiked"))
    capfd.readouterr()
    skipped = train(cfg(tmp_path / "skip", "train.skip_steps=[[3,4]]"))
    assert "pretrain: steps 3-4 left out (train.skip_steps): samples 16 to 31 not trained on" in capfd.readouterr().err
    assert (skipped["steps"], skipped["trained_steps"], skipped["steps_left_out"], skipped["samples"]) == (6, 4, 2, 48)
    mine, theirs = read[str(tmp_path / "skip")], read[str(tmp_path / "spiked")]
    assert sorted(mine) == [1, 2, 5, 6] and all(torch.equal(a, b) for s in mine for a, b in zip(mine[s], theirs[s]))
    rows, logged = (read_jsonl(tmp_path / run / "metrics.jsonl") for run in ("skip", "spiked"))
    trained = lambda rows: [(r["loss"], r["lr"], r["grad_norm"]) for r in rows]  # noqa: E731
    assert [r["step"] for r in rows] == [1, 2, 5, 6] and trained(rows[:2]) == trained(logged[:2])
    assert [r["lr"] for r in rows[2:]] == [r["lr"] for r in logged[4:]]  # the schedule moved on
    assert sorted(p.name for p in (tmp_path / "skip" / "checkpoints").glob("step_*")) == ["step_00000002",
                                                                                          "step_00000006"]
    steps = [torch.load(tmp_path / run / "checkpoints" / "step_00000006" / "trainer.pt")["optimizer_steps"]
             for run in ("skip", "spiked")]
    assert steps == [4, 6] and ckpt("skip", 6).meta["consumed_samples"] == 48
    # the spiked run rolled back to step 2: its later checkpoints, log rows and summary kept aside
    out = call_cli("checkpoints_tools", "rollback", tmp_path / "spiked", "--step", "2").stdout
    aside = tmp_path / "spiked" / "checkpoints" / "rolled-back-after-step_00000002"
    assert out == (f"{tmp_path / 'spiked'} resumes from step 2 now; moved to {aside}: step_00000004, step_00000006; "
                   "4 rows of metrics.jsonl, 1 row of valid.jsonl. Re-run its training command to resume, with "
                   "train.skip_steps=[[FIRST,LAST]] added to leave the batches of those steps out\n")
    assert sorted(p.name for p in aside.iterdir()) == ["metrics.jsonl", "step_00000004", "step_00000006",
                                                       "summary.json", "valid.jsonl"]
    assert read_jsonl(aside / "metrics.jsonl") == logged[2:] and json.load(open(aside / "summary.json")) == spiked
    assert [r["step"] for r in read_jsonl(tmp_path / "spiked" / "metrics.jsonl")] == [1, 2]
    assert C.resolve(str(tmp_path / "spiked")).endswith("step_00000002")
    again = call_cli("checkpoints_tools", "rollback", tmp_path / "spiked", "--step", "2").stdout
    assert again == "step_00000002 is already the checkpoint " f"{tmp_path / 'spiked'} resumes, and none is later: " \
                    "nothing to roll back\n"
    proc = call_cli("checkpoints_tools", "rollback", tmp_path / "spiked", "--step", "3", check=False)
    assert proc.returncode == 2 and proc.stderr == (
        f"checkpoints_tools: error: {tmp_path / 'spiked' / 'checkpoints'} has no checkpoint of step 3 (it has step 2); "
        "pass --step 2, the last before it\n")
    resumed = train(cfg(tmp_path / "spiked", "train.skip_steps=[[3,4]]"))
    assert resumed["resumed_from"]["step"] == 2 and (resumed["trained_steps"], resumed["steps_left_out"]) == (2, 2)
    assert same(ckpt("skip", 6), ckpt("spiked", 6))
    assert [r["step"] for r in read_jsonl(tmp_path / "spiked" / "metrics.jsonl")] == [1, 2, 5, 6]
    capfd.readouterr()  # a range the checkpoint resumed is past: said, not silently trained
    train(cfg(tmp_path / "skip", "train.steps=7", "train.skip_steps=[[3,4],[5,5]]"))
    assert (f"pretrain: warning: train.skip_steps [[5, 5]] starts at or before step 6, the checkpoint resumed: the "
            "steps up to it were trained; to leave them out, stop and roll the run back to a checkpoint before them "
            f"(python -m checkpoints_tools rollback {tmp_path / 'skip'} --step M)") in capfd.readouterr().err
    # a rollback cut short (here after moving the checkpoints) is finished by the same command, into its directory
    import checkpoints_tools.rollback as R

    def cut_short(*args):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(R, "set_aside_past", cut_short)
        assert call_cli("checkpoints_tools", "rollback", tmp_path / "skip", "--step", "2", check=False).returncode == 130
    call_cli("checkpoints_tools", "rollback", tmp_path / "skip", "--step", "2")
    assert [p.name for p in (tmp_path / "skip" / "checkpoints").glob("rolled-back-*")] == [
        "rolled-back-after-step_00000002"]
    assert sorted(p.name for p in (tmp_path / "skip" / "checkpoints" / "rolled-back-after-step_00000002").iterdir()
                  ) == ["metrics.jsonl", "step_00000006", "step_00000007", "summary.json", "valid.jsonl"]


def test_a_batch_ramp_trains_as_runs_of_each_of_its_batches(dataset, tmp_path):
    """train.batch_rampup=[4, 12, 12] under a global batch of 16 and micro batch 8: steps 1-3 read 4 samples (one
    micro-batch of 4: the largest that divides the step's batch), then 16 (two of 8: DeepSpeed's micro batch and
    accumulation change after an odd count of micro-batches). Its weights and moments equal, bit for bit, those of a
    run of 4-sample steps at step 3 and of that run resumed with the whole batch at step 6 (a constant learning rate:
    the ramp's schedule counts samples)."""
    from pretrain import checkpoint as C
    from pretrain.train import train

    def cfg(out, *more):
        return _cfg(dataset, f"out_dir={tmp_path / out}", "optimizer.warmup_steps=0", "optimizer.schedule=constant",
                    "checkpoint.interval=3", "checkpoint.keep=0", "train.global_batch_size=16",
                    "train.micro_batch_size=8", *more)

    ramp = train(cfg("ramp", "train.steps=6", "train.batch_rampup=[4,12,12]"))
    assert ramp["samples"] == 3 * 4 + 3 * 16
    rows = read_jsonl(tmp_path / "ramp" / "metrics.jsonl")
    assert [round(r["samples_per_s"] * r["step_time_s"]) for r in rows] == [4, 4, 4, 16, 16, 16]
    train(cfg("steps", "train.steps=3", "train.global_batch_size=4", "train.micro_batch_size=4"))
    train(cfg("steps", "train.steps=6"))  # (resumed: the checkpoint's samples read, 16 a step from there)
    for step in (3, 6):
        mine, theirs = (C.Pieces(str(tmp_path / run / "checkpoints" / f"step_{step:08d}")) for run in ("ramp", "steps"))
        assert all(torch.equal(mine.full(kind, n), theirs.full(kind, n)) for kind in C.KINDS for n in mine.params)


def test_a_run_without_a_held_out_split_says_so_and_sums_up_its_training_loss(dataset, tmp_path, capfd):
    """data.valid_fraction=0: an eval_interval that evaluates nothing is said once (it was silent), no empty "step N:"
    line nor {step} rows are logged, and the summary holds the training loss (its only measure of the run)."""
    from pretrain.train import train

    summary = train(_cfg(dataset, f"out_dir={tmp_path}", "data.valid_fraction=0", "train.eval_interval=1",
                         "train.steps=2", "checkpoint.interval=0"))
    err = capfd.readouterr().err
    assert "pretrain: note: data.valid_fraction=0 holds out nothing: train.eval_interval=1 evaluates nothing" in err
    assert not re.search(r"^pretrain: step \d+: *$", err, re.M), err
    assert not (tmp_path / "valid.jsonl").exists() and not [k for k in summary if k.startswith("valid_")]
    losses = [r["loss"] for r in read_jsonl(tmp_path / "metrics.jsonl")]
    assert summary["train_loss"] == pytest.approx(sum(losses) / 2, abs=1e-4)


def test_bad_configs_fail_before_training(dataset, tmp_path):
    base = ["pretrain", "train", "--config", "bert-tiny", "--set", f"data.path={dataset}", f"out_dir={tmp_path}"]
    proc = run_cli(*base, "model.hidden_sizes=3", check=False)
    assert proc.returncode == 2 and "hidden_sizes" in proc.stderr and "hidden_size" in proc.stderr
    proc = run_cli(*base, "model.num_heads=3", check=False)
    assert proc.returncode == 2 and "num_heads" in proc.stderr
    proc = run_cli(*base, "model.vocab_size=999", check=False)
    assert proc.returncode == 2 and "does not match the dataset's tokenizer" in proc.stderr
    proc = run_cli("pretrain", "train", "--config", "bert-tiny", "--set", f"data.path={tmp_path}/none",
                   f"out_dir={tmp_path}", check=False)
    assert proc.returncode == 2 and f"{tmp_path}/none does not exist" in proc.stderr
    assert not (tmp_path / "checkpoints").exists()


def test_gpt2_tiny_trains_and_reports_perplexity(dataset, tmp_path, capfd):
    """...with train.micro_batch_size=auto: the run picks the micro batch the memory estimate fits on this machine
    (here the whole batch: a CPU's memory), logs it and records it in its config.yaml; metrics.jsonl logs the
    learning rate each step used."""
    from pretrain import device, memory
    from pretrain.optim import Schedule
    from pretrain.train import train

    cfg = load("gpt2-tiny", [f"data.path={dataset}", f"out_dir={tmp_path}", "train.steps=4", "data.num_workers=0",
                             "data.seq_len=32", "train.global_batch_size=4", "train.micro_batch_size=auto",
                             "optimizer.warmup_steps=1", "train.eval_interval=0", "data.valid_fraction=0.02"])
    summary = train(cfg)
    assert summary["steps"] == 4 and summary["valid_ppl"] > 1
    assert json.load(open(tmp_path / "summary.json"))["steps"] == 4
    schedule = Schedule.from_config(cfg.optimizer, 4)  # each row's lr is the one its step used: 0 first (warmup)
    assert [r["lr"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == pytest.approx([schedule(s) for s in range(4)])
    picked = load(str(tmp_path / "config.yaml")).train.micro_batch_size
    assert picked == memory.auto_micro_batch(cfg, 1, device.capacity_gib()) == 4
    assert "train.micro_batch_size=auto: 4 (1 accumulation step of 4 sequences per rank" in capfd.readouterr().err


def assert_report(run_dir):
    """`ptm report` plots the run into a PNG that an image reader opens, and prints its summary."""
    from matplotlib.image import imread

    proc = run_cli("pretrain", "report", run_dir)
    assert "report.png" in proc.stdout and '"steps"' in proc.stdout
    assert imread(run_dir / "report.png").shape[:2] == (1100, 1210)  # (11 x 10 inches, 110 dpi)


def test_ernie2_schedule_switches_tasks_at_the_stage_boundaries(dataset, tmp_path):
    """Three stages, each adding a task and keeping the earlier ones (continual multi-task learning): each stage's
    samples come from its tasks; the tasks in the loss change at each boundary; a task's head receives gradient in
    exactly the steps of the stages that include it, and the parameters no gradient reaches are those the objective
    names idle, left untouched (no weight decay) until their first step, an Adam step of step count 1; each evaluation
    reports the stage of its step and its tasks."""
    from pretrain.objectives.ernie import TASKS
    from pretrain.data.factory import build_sources
    from pretrain.train import Trainer

    stages = [{"knowledge_masking": 1, "capitalization": 1},
              {"knowledge_masking": 1, "capitalization": 1, "sentence_reordering": 1},
              {"knowledge_masking": 1, "capitalization": 1, "sentence_reordering": 1, "sentence_distance": 1}]
    cfg = load("ernie-tiny", [f"data.path={dataset}", f"out_dir={tmp_path}", "data.num_workers=0", "data.seq_len=32",
                              "model.max_position_embeddings=32", "data.valid_fraction=0.02", "train.steps=6",
                              "train.global_batch_size=16", "train.micro_batch_size=8", "train.eval_interval=1",
                              "ernie.stages=" + json.dumps([{"steps": 2, "tasks": t} for t in stages])])
    for stage in cfg.ernie.stages:
        source, _ = build_sources(cfg, stage)
        samples = [source.sample(0, i) for i in range(min(200, len(source)))]
        assert {TASKS[int(s["task"])] for s in samples} == set(stage.tasks)
        for s in samples:
            task = TASKS[int(s["task"])]
            assert ((s["labels"] != -100).any()) == (task == "knowledge_masking") or task == "knowledge_masking"
            assert ((s["token_labels"] != -100).any()) <= (task in ("capitalization", "token_document_relation"))
            assert (int(s["seq_label"]) != -100) == (task in ("sentence_reordering", "sentence_distance"))
            assert (s["task_type_ids"] == (1 if task.startswith("sentence") else 0)).all()
    trainer = Trainer(cfg)
    heads = {**trainer.model.tasks.token, **trainer.model.tasks.sequence, "knowledge_masking": trainer.model.mlm.dense}
    graded = {name: set() for name in heads}
    for name, head in heads.items():
        head.weight.register_hook(lambda grad, name=name: graded[name].add(trainer.step))
    reached = {n: set() for n, _ in trainer.model.named_parameters()}
    for n, p in trainer.model.named_parameters():
        p.register_hook(lambda grad, n=n: reached[n].add(trainer.step))
    weights = {}  # before each optimizer step (DeepSpeed steps each param group in a call of its own)
    trainer.optimizer.register_step_pre_hook(lambda *_: weights.setdefault(
        trainer.step, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}) and None)
    trainer.fit()
    in_stage = {name: {step for step in range(6) if name in stages[step // 2]} for name in heads}
    assert graded == in_stage
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    for step in range(6):  # the parameters a stage declares idle are those no gradient reaches, left as they are
        assert {n for n in reached if step not in reached[n]} == trainer.idle(step), step
    late = "tasks.sequence.sentence_distance.bias"  # joins at step 5 (index 4), after 4 applied steps
    assert all(torch.equal(weights[step][n], weights[0][n]) for step in range(5)  # no decay while idle
               for n in (late, late.replace("bias", "weight")))
    first = (weights[5][late] - weights[4][late]).abs()  # its first Adam step: lr * |g| / (|g| + eps) ~ lr
    assert first.min() > 0.999 * rows[4]["lr"] and first.max() <= rows[4]["lr"] * (1 + 1e-5), (first, rows[4]["lr"])
    term = {"mlm": "knowledge_masking"}
    for i, stage in enumerate(stages):
        mine = [r for r in rows if r["stage"] == i + 1]
        assert [r["step"] for r in mine] == [2 * i + 1, 2 * i + 2]
        seen = {term.get(k[:-5], k[:-5]) for r in mine for k in r if k.endswith("_loss")}
        assert seen == set(stage), (i, seen)
    assert_report(tmp_path)
    evaluations = [json.loads(line) for line in open(tmp_path / "valid.jsonl")]
    assert [e["valid_stage"] for e in evaluations] == [1, 1, 2, 2, 3, 3]
    for e in evaluations:
        tasks = {term.get(k[6:-4], k[6:-4]) for k in e if k.endswith("_acc") and "unigram" not in k}
        assert tasks == set(stages[e["valid_stage"] - 1]), e


def test_ernie1_knowledge_masking_stages(dataset, tmp_path):
    """ERNIE 1.0: basic-level masking first, then phrase and entity units, switched by ernie.stages; the log names
    the first step of the new stage as metrics.jsonl numbers it, and the run's last evaluation (after step 4, not an
    eval_interval step) is in valid.jsonl with the one after step 3."""
    from pretrain.train import Trainer

    cfg = _cfg(dataset, f"out_dir={tmp_path}", "model.arch=ernie", "data.masking=knowledge", "train.steps=4",
               "train.eval_interval=3", "train.log_interval=1",
               "ernie.stages=[{steps: 2, knowledge_level: token}, {steps: 2, knowledge_level: entity}]")
    trainer = Trainer(cfg)
    assert trainer._sources(0)[0].masker.span_kinds == ()
    assert trainer._sources(2)[0].masker.span_kinds == ("phrase", "entity")
    with contextlib.redirect_stdout(io.StringIO()) as printed, contextlib.redirect_stderr(printed):
        summary = trainer.fit()
    assert summary["steps"] == 4
    printed = printed.getvalue()  # the stage before's last step, then the new stage, then its first step
    assert printed.index("pretrain: step 2/4: ") < printed.index("pretrain: step 3: stage 2: ") < printed.index(
        "pretrain: step 3/4: ")
    assert [json.loads(line)["stage"] for line in open(tmp_path / "metrics.jsonl")] == [1, 1, 2, 2]
    valid = [json.loads(line) for line in open(tmp_path / "valid.jsonl")]
    assert [v["step"] for v in valid] == [3, 4]
    assert valid[-1]["valid_loss"] == pytest.approx(summary["valid_loss"], abs=1e-4)
    bad = _cfg(dataset, "data.masking=whole_word", "train.steps=4", "ernie.stages=[{steps: 4}]")
    with pytest.raises(Exception, match="data.masking=knowledge"):
        bad.validate()


def test_ernie2_semantic_task_from_labelled_pairs(dataset, corpus, sp_model, tmp_path):
    """IR relevance from a user's labelled Arrow dataset: query and title from the same docstring (1) or not (0)."""
    from conftest import write_jsonl
    from pretrain.objectives.ernie import TASKS
    from pretrain.data.factory import build_sources
    from pretrain.train import train

    firsts = [d.split(". ")[0] + "." for d in corpus["en"][:80] if d.count(". ") >= 2]
    seconds = [d.split(". ")[1] + "." for d in corpus["en"][:80] if d.count(". ") >= 2]
    rows = [{"q": q, "t": seconds[i] if i % 2 else seconds[(i + 7) % len(seconds)], "y": i % 2}
            for i, q in enumerate(firsts)]
    pairs = tmp_path / "pairs"
    quick_build([write_jsonl(tmp_path / "pairs.jsonl", rows)], pairs, tokenizer=sp_model, text_field="q",
                pair_field="t", label_field="y", dedup=False)
    cfg = load("ernie-tiny", [f"data.path={dataset}", f"out_dir={tmp_path / 'run'}", "data.num_workers=0",
                              "data.seq_len=48", "model.max_position_embeddings=48", "data.valid_fraction=0.02",
                              "ernie.stages=[{steps: 4, tasks: {knowledge_masking: 1}}, "
                              "{steps: 4, tasks: {knowledge_masking: 1, ir_relevance: 1}}]",
                              f"ernie.task_data.ir_relevance={pairs}"])
    source, _ = build_sources(cfg, cfg.ernie.stages[1])
    labelled = Corpus(str(pairs))
    samples = [s for s in (source.sample(0, i) for i in range(60)) if TASKS[int(s["task"])] == "ir_relevance"]
    assert samples and all(int(s["seq_label"]) in (0, 1) and (s["task_type_ids"] == 2).all() for s in samples)
    s = samples[0]
    body = s["input_ids"][1:s["attention_mask"].sum() - 1]
    assert (body == labelled.special_ids["sep"]).sum() == 1  # [CLS] query [SEP] title [SEP]
    summary = train(cfg)
    assert "valid_ir_relevance_acc" in summary and "valid_mlm_acc" in summary


def test_running_out_of_memory_is_one_line_naming_the_fix(dataset, tmp_path):
    """A micro batch the device's memory cannot hold (here the host's, capped by RLIMIT_AS; on a GPU torch's
    OutOfMemoryError) ends the rank in one line saying what ran out and what to set, exit 2, not a traceback; a model
    whose weights cannot be held names the fixes for those (the micro batch's were named)."""
    import resource
    import socket
    import subprocess
    import sys

    from conftest import ROOT

    def capped():
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))  # twice what a tiny run maps, 16 GiB short

    batch = ["model.ffn_hidden_size=131072", "train.global_batch_size=1024", "train.micro_batch_size=1024"]
    for sets, says in ((batch, "(tried to allocate 16.00 GiB) before the first step: lower train.micro_batch_size "
                               "(gradient accumulation keeps the global batch) or set it to auto (the largest `ptm "
                               "plan` fits), or set model.activation_checkpointing=true; then re-run to resume from "
                               "the last checkpoint"),
                       (["model.ffn_hidden_size=4194304"], "(tried to allocate 2.00 GiB) building the model and its "
                        "optimizer states: they do not fit; partition them (raise zero.stage: 3 splits the weights "
                        "too; or parallel.tp; or zero.offload=true) or train a smaller model (model.hidden_size, "
                        "model.num_layers); `ptm plan` shows the memory by component")):
        proc = subprocess.run([sys.executable, "-m", "pretrain", "train", "--config", "bert-tiny", "--set",
                               f"data.path={dataset}", f"out_dir={tmp_path}", "data.num_workers=0", "data.seq_len=32",
                               "model.max_position_embeddings=32", "train.steps=1", "optimizer.warmup_steps=0",
                               "train.eval_interval=0", "checkpoint.interval=0", *sets],
                              cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=capped)
        errors = [line for line in proc.stderr.splitlines() if "error" in line]
        assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert errors[0] == f"pretrain: error: rank 0 on {socket.gethostname()}: host memory ran out {says}"


def test_a_run_whose_out_dir_refuses_its_files_is_one_line(dataset, tmp_path):
    """A full disk (here files over RLIMIT_FSIZE: EFBIG, as ENOSPC) refusing the run's own files before any checkpoint
    (its config.yaml, written first) ends the rank in one line naming the file, by the name it was to have, exit 2."""
    import os
    import resource
    import socket
    import subprocess
    import sys

    from conftest import ROOT

    proc = subprocess.run([sys.executable, "-m", "pretrain", "train", "--config", "bert-tiny", "--set",
                           f"data.path={dataset}", f"out_dir={tmp_path}", "data.num_workers=0", "train.steps=1",
                           "optimizer.warmup_steps=0"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024)))
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors[0] == (f"pretrain: error: rank 0 on {socket.gethostname()}: cannot write {tmp_path}/config.yaml: "
                         "File too large; free space there (or raise the quota) and re-run to resume from the last "
                         "checkpoint")
    assert os.listdir(tmp_path) == []


def test_an_out_dir_nothing_creates_and_a_batch_past_the_data_are_one_line(dataset, tmp_path):
    """An out_dir that the checks cannot see fail (under /proc: a FileNotFoundError traceback from the run log) and a
    global batch larger than the training split (its micro-batches, held before the step, filled the memory until
    the OOM killer came): one line each naming the key and the fix, exit 2."""
    import subprocess
    import sys

    from conftest import ROOT

    for sets, says in ((["out_dir=/proc/ptm-run"], "out_dir=/proc/ptm-run cannot be created (No such file or "
                                                   "directory); set out_dir under a directory this user may write"),
                       ([f"out_dir={tmp_path}/run", "train.global_batch_size=1000000000", "train.micro_batch_size=2"],
                        "train.global_batch_size=1,000,000,000 is more than the ")):
        proc = subprocess.run([sys.executable, "-m", "pretrain", "train", "--config", "bert-tiny", "--set",
                               f"data.path={dataset}", "data.num_workers=0", "train.steps=1",
                               "optimizer.warmup_steps=0", *sets], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        errors = [line for line in proc.stderr.splitlines() if "error" in line]
        assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert errors[0].startswith(f"pretrain: error: {says}"), errors


def test_a_gpu_out_of_memory_names_what_it_tried_to_allocate():
    import torch

    from pretrain.device import out_of_memory

    said = out_of_memory(torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which 1.05 GiB is "
        "free. Including non-PyTorch memory, this process has 78.05 GiB memory in use."), 12)
    assert said.startswith("the GPU ran out of memory (tried to allocate 2.00 GiB) after 12 steps: lower ")
    assert out_of_memory(RuntimeError("CUDA error: an illegal memory access was encountered"), 12) is None


def test_failed_json_keeps_the_first_line_of_a_started_run_and_no_preemption(tmp_path, monkeypatch):
    """failed.json holds the first line said where the run this process started failed (the rank whose own failure
    it was says it before the others lose contact), none for a run not started (out_dir as it was) nor for a
    preemption (exit 75: checkpointed and requeued); `ptm report` prints it after the run's summary."""
    from conftest import call_cli
    from pretrain import runlog

    worker = "pretrain: error: rank 1 on host: data-loader worker (pid 7) was killed (Killed), ..."
    monkeypatch.setattr(runlog, "started", None)
    runlog.failed(worker, 2, RuntimeError())
    monkeypatch.setattr(runlog, "started", str(tmp_path))
    runlog.failed("pretrain: stopped by SIGTERM at step 3: ...; exit 75: requeue or resubmit the job to resume", 75)
    assert not (tmp_path / "failed.json").exists()
    runlog.failed(worker, 2, RuntimeError())
    runlog.failed("pretrain: error: rank 0 on host lost contact with the other ranks (...)", 4, RuntimeError())
    assert json.load(open(tmp_path / "failed.json")) == {"error": worker, "exception": "RuntimeError", "exit": 2}
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')
    (tmp_path / "summary.json").write_text('{"steps": 1}')
    shown = call_cli("pretrain", "report", tmp_path).stdout
    assert shown.index('"steps": 1') < shown.index(f'"error": "{worker}"')


@pytest.mark.parametrize("how", ["SIGINT", "failure", "a worker killed", "a worker's SIGBUS"])
def test_sigint_or_a_failure_mid_run_ends_the_process_and_its_loader_workers(dataset, tmp_path, how):
    """SIGINT to the training process alone (Ctrl-C) ends it with one line and exit 130; an unexpected failure (here
    a test pause's child that dies) with its traceback and exit 1; a data-loader worker killed (SIGKILL: the
    out-of-memory killer's; SIGBUS: a full /dev/shm's) with one line naming the worker and what to do, and exit 2,
    not torch's traceback; all
    while data-loader workers run, which ignore SIGTERM (pretrain/data/loader.py) and once kept the process waiting
    for them at its exit, forever. Each leaves that last line, the exception's type and the status in out_dir's
    failed.json, which the next run there removes as it starts (here one that finishes)."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    import psutil

    from conftest import ROOT
    from runs import kill_when

    pause = tmp_path / "pause"
    pause.mkdir()
    run = ["pretrain", "train", "--config", "bert-tiny", "--set", f"data.path={dataset}", f"out_dir={tmp_path / 'run'}",
           "data.num_workers=2", "data.seq_len=32", "model.max_position_embeddings=32", "train.global_batch_size=8",
           "train.micro_batch_size=8", "train.steps=50", "optimizer.warmup_steps=1", "train.eval_interval=0",
           "checkpoint.interval=0", "data.valid_fraction=0.02"]
    proc = subprocess.Popen([sys.executable, "-m", *run], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, "PTM_TEST_PAUSE": f"workers:{pause}"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # (a shell's `&`)
    try:
        deadline = time.time() + 300
        main = psutil.Process(proc.pid)

        def children():  # {child: its command line}, the live ones
            out = {}
            for c in main.children():
                with contextlib.suppress(psutil.NoSuchProcess):
                    out[c] = c.cmdline() if c.status() != psutil.STATUS_ZOMBIE else None
            return out

        waiter = []
        while not waiter:  # (its file is written before the waiter starts; it forks before it execs)
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
            time.sleep(0.1)
            waiter = [c for c, line in children().items() if "go.workers" in " ".join(line or [])]
        # the loader's workers: forked, not exec'd (another child, e.g. a finished one not yet reaped, is no worker)
        workers = [c for c, line in children().items() if line == main.cmdline()]
        assert len(workers) == 2, children()
        if how == "SIGINT":
            proc.send_signal(signal.SIGINT)
        elif how == "failure":
            waiter[0].kill()
        else:
            workers[0].send_signal(signal.SIGKILL if how == "a worker killed" else signal.SIGBUS)
            (pause / "go.workers").touch()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            kill_when(proc, lambda: True)
    err = err.replace("\0", "")  # (torch's bus error message in the worker ends in its C string's NUL)
    lines = [line for line in err.splitlines() if "arning" not in line]
    if how == "SIGINT":
        assert proc.returncode == 130 and lines[-1].startswith("pretrain: interrupted (SIGINT)"), err[-3000:]
        assert "Traceback" not in err
    elif how == "failure":
        assert proc.returncode == 1 and "Traceback" in err and "CalledProcessError" in lines[-1], err[-3000:]
    else:
        said = ("was killed (Killed), most often by the system's out-of-memory killer" if how == "a worker killed" else
                "was killed by SIGBUS: shared memory (/dev/shm) ran out")
        assert proc.returncode == 2 and "Traceback" not in err and lines[-1].startswith(
            f"pretrain: error: rank 0 on {socket.gethostname()}: data-loader worker (pid {workers[0].pid}) {said}") \
            and "data.num_workers lower" in lines[-1], err[-3000:]
    assert not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    failed = tmp_path / "run" / "failed.json"
    kind = {"SIGINT": "KeyboardInterrupt", "failure": "CalledProcessError"}.get(how, "RuntimeError")
    assert json.load(open(failed)) == {"error": lines[-1].removeprefix("[rank0]: "),  # (torch's, on a traceback)
                                       "exception": kind, "exit": proc.returncode}
    if how == "SIGINT":
        run_cli(*run, "train.steps=1", "data.num_workers=0")
        assert not failed.exists() and (tmp_path / "run" / "summary.json").exists()
