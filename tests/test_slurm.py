"""Training under a real Slurm with two simulated nodes (tests/slurm_cluster.py: slurmctld and two slurmd on
loopback), through the real `sbatch --wait`: slurm/pretrain.sbatch with srun, the deepspeed launcher's slurm
backend and mpirun across the nodes; a time limit's warning signal, scancel and a killed task, each resumed
exactly; a stop signal at every phase of start-up and at the other moments of a run, under each launcher (1 node x
2 tasks); the prep -> train -> convert chain of `ptm launch slurm`.

Every other training job here is 2 nodes x 2 tasks, TP=2 x DP=2 under ZeRO-2, dropout on, so a resumed run that is
bit-identical to an uninterrupted one restored every RNG stream, the data position and the optimizer."""
import concurrent.futures
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import psutil
import pytest

from conftest import ROOT, free_port, run_cli
from launchers.cli import wait_for
from pretrain import checkpoint as C
from runs import assert_same_checkpoints, latest_step, max_rel_diff, summary, weights

pytestmark = pytest.mark.distributed

SCRIPT = os.path.join(ROOT, "slurm", "pretrain.sbatch")
NODES = ["--nodes=2", "--ntasks-per-node=2"]


def settings(data, out, *more) -> list[str]:
    return [f"data.path={data}", "data.num_workers=0", "data.seq_len=32", "model.max_position_embeddings=32",
            "train.global_batch_size=8", "train.micro_batch_size=2", "optimizer.warmup_steps=1", "train.eval_interval=0",
            "data.valid_fraction=0.02", "parallel.tp=2", "zero.stage=2", "train.log_interval=1000",
            "checkpoint.keep=0", "train.steps=6", "checkpoint.interval=1000", f"out_dir={out}", *more]


LONG = ("train.steps=240", "checkpoint.interval=40")  # 30-45 s of training at 2 x 2 on two cores: a stop mid-run


def env(slurm, launcher: str = "srun") -> dict:
    return {**slurm.env, "PTM_PYTHON": sys.executable, "PTM_LAUNCHER": launcher, "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "PTM_MPIRUN_ARGS": "--mca btl_tcp_if_include lo"}


def sbatch(slurm, log, *args, launcher="srun", wait=True, more_env=None):
    """Submit slurm/pretrain.sbatch; with wait, the finished CompletedProcess and the job's log."""
    cmd = ["sbatch", *(["--wait"] if wait else ["--parsable"]), "-o", str(log), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**env(slurm, launcher), **(more_env or {})},
                          cwd=os.path.dirname(log), timeout=900)
    return proc, (open(log).read() if wait and os.path.exists(log) else "")


def train_job(slurm, tmp_path, name, *more, launcher="srun", sbatch_args=(), data, more_env=None):
    """A 2 x 2 training job, waited for by `sbatch --wait` and then through any requeue (Slurm's --wait may return
    when the job is requeued)."""
    out = tmp_path / name
    proc, _ = sbatch(slurm, tmp_path / f"{name}.log", *NODES, *sbatch_args, SCRIPT, "bert-tiny", "--set",
                     *settings(data, out, *more), launcher=launcher, more_env=more_env)
    completed = wait_for(proc.stdout.split()[-1], poll_s=0.5, env=slurm.env) == 0
    log = open(tmp_path / f"{name}.log").read()
    assert completed, proc.stderr + log[-4000:]
    return out, log


@pytest.fixture(scope="module")
def torchrun_reference(train_data, tmp_path_factory):
    """The short run of the jobs here under torchrun (4 processes, one node): its directory."""
    out = tmp_path_factory.mktemp("slurm_ref") / "torchrun"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", f"--master_port={free_port()}",
           "-m", "pretrain", "train", "--config", "bert-tiny", "--set", *settings(train_data, out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def long_reference(slurm, train_data, tmp_path_factory):
    """The long run (LONG) as an uninterrupted 2-node job: its directory."""
    out, _ = train_job(slurm, tmp_path_factory.mktemp("slurm_long"), "long", *LONG, data=train_data)
    return out


@pytest.mark.parametrize("launcher", ["srun", "deepspeed", "mpirun"])
def test_a_two_node_job_trains_what_torchrun_trains(slurm, train_data, torchrun_reference, tmp_path, launcher):
    """sbatch --nodes 2 --ntasks-per-node 2 slurm/pretrain.sbatch bert-tiny --set parallel.tp=2 zero.stage=2 ...:
    srun, the deepspeed launcher (slurm backend, hostfile from the allocation) or mpirun (Open MPI) start the
    tasks; ptm's rendezvous joins them; the weights equal a 4-process torchrun run's."""
    out, log = train_job(slurm, tmp_path, "run", launcher=launcher, data=train_data)
    assert f"on n[1-2] via {launcher}" in log
    assert not list(tmp_path.glob("hostfile-*")) and not end_dirs(log)  # (the job's files went with it)
    assert summary(out)["layout"] == {"tp": 2, "dp": 2, "zero_stage": 2, "precision": "fp32"}
    assert max_rel_diff(weights(out), weights(torchrun_reference), heads=2) < 1e-5


def end_dirs(log: str) -> list:
    """The directories of slurm/pretrain.sbatch's job (the exit status noted, deepspeed's hostfile) in this host's
    temporary directory, the job named by its log."""
    job = log.split("ptm: job ", 1)[1].split()[0]
    return list(pathlib.Path(os.environ.get("TMPDIR", "/tmp")).glob(f"ptm-{job}.*"))


def release_requeued(slurm, stop: threading.Event, pause: pathlib.Path, ranks: int):
    """Let the ranks paused at their first step's collective (`pause`, PTM_TEST_PAUSE) go once each has recorded the
    stop signal. Slurm holds a requeued job back (BeginTime a couple of minutes ahead); let it start 2 s after the
    requeue at the earliest: slurmd refuses a job whose credential is from the second its previous run's was revoked
    in ("Job credential revoked"), and the job would end FAILED."""
    while not stop.wait(1):
        if len(list(pause.glob("signalled.*"))) == ranks:
            (pause / "go.collective").touch()
        jobs = subprocess.run(["squeue", "-h", "-o", "%i %T %r"], capture_output=True, text=True, env=slurm.env).stdout
        for line in jobs.splitlines():
            job, state, reason = (line.split() + ["", ""])[:3]
            if state == "PENDING" and reason == "BeginTime":
                time.sleep(2)
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=slurm.env, capture_output=True)


@pytest.mark.serial  # its start-up must take less than 25 s: on 2 cores shared with another test it took 33
def test_a_time_limit_warning_checkpoints_requeues_and_resumes_exactly(slurm, train_data, long_reference, tmp_path):
    """--time=1 --signal=B:USR1@5: before its limit the script gets SIGUSR1 and forwards it to every task, the ranks
    checkpoint at one step, exit 75, the script requeues the job, which resumes (as often as the limit comes) and ends
    bit-identical to the uninterrupted job. slurmctld sends the warning at its first periodic check (every 30 s)
    within 30 s of the lead, so 25 to 55 s into each start: after start-up (a lead of 20 s could land at 10 s, before
    the first step, and end the job with exit 5, rightly), and the ranks wait for it in their first step (a machine
    fast enough to train the whole run in the window ended before it). Slurm's limits are whole minutes, so the
    window cannot move later without a run past 85 s: the test runs alone instead (`make test`'s serial phase)."""
    pause = tmp_path / "pause"
    pause.mkdir()
    stop = threading.Event()
    helper = threading.Thread(target=release_requeued, args=(slurm, stop, pause, 4), daemon=True)
    helper.start()
    try:
        out, log = train_job(slurm, tmp_path, "limited", *LONG, sbatch_args=("--time=1", "--signal=B:USR1@5"),
                             data=train_data, more_env={"PTM_TEST_PAUSE": f"collective:{pause}"})
    finally:
        stop.set()
    assert "stopped by SIGUSR1" in log and "requeueing job" in log and "(restart 1)" in log, log[-3000:]
    assert summary(out)["resumed_from"] is not None
    assert_same_checkpoints(out, long_reference)


def wait_until(predicate, timeout=300, what="the condition"):
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def job_state(slurm, job: str) -> str:
    info = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, env=slurm.env).stdout
    return info.split("JobState=", 1)[1].split()[0] if "JobState=" in info else "GONE"


def steps_done(out) -> int:
    try:
        return sum(1 for _ in open(out / "metrics.jsonl"))
    except OSError:
        return 0


@dataclass(frozen=True)
class Stop:
    """A stop signal at a named moment of a job (1 node x 2 tasks, TP=2): the phase the ranks pause at
    (pretrain/signals.py `pause`; PHASE@0: rank 0 alone, the other waits in a collective), the signal (USR1: Slurm's
    time-limit warning to the batch shell, --signal=B:USR1@N; TERM: scancel), and the outcome: "no-progress" (exit 5,
    one line), "requeued" (a checkpoint at `step`, exit 75, requeued), "completed" or "cancelled". `late`: rank 1
    is still ending when rank 0 exits, so the launcher kills it (and reports that kill, not the status they agreed
    on)."""

    name: str
    launcher: str
    phase: str
    outcome: str
    step: int = 0
    signal: str = "USR1"
    more: tuple = ()
    sbatch: tuple = ()
    resumed: bool = False
    late: bool = False


STOPS = [Stop("before-handlers", "srun", "start", "no-progress"),
         Stop("one-before-handlers", "srun", "start@1", "no-progress"),
         Stop("imports", "srun", "imports", "no-progress", late=True),
         Stop("build", "srun", "build", "no-progress"),
         Stop("workers-resumed", "srun", "workers", "no-progress", more=("data.num_workers=1", *LONG), resumed=True),
         Stop("collective", "srun", "collective@0", "requeued", 1, sbatch=("--cpus-per-task=2",), late=True),
         Stop("evaluation", "srun", "evaluation", "requeued", 2, more=("train.eval_interval=1",)),
         Stop("checkpoint", "srun", "checkpoint", "requeued", 2, more=("checkpoint.interval=1",)),
         Stop("last-step", "srun", "last", "completed", 3, sbatch=("--hold",)),
         Stop("scancel-build", "srun", "build", "cancelled", signal="TERM"),
         Stop("deepspeed-build", "deepspeed", "build", "no-progress"),
         Stop("deepspeed-collective", "deepspeed", "collective@0", "requeued", 1, late=True),
         Stop("mpirun-build", "mpirun", "build", "no-progress"),
         Stop("mpirun-collective", "mpirun", "collective@0", "requeued", 1),
         Stop("mpirun-scancel", "mpirun", "collective@0", "cancelled", 1, signal="TERM")]


def stopped_job(slurm, data, tmp, resumed_from, case: Stop) -> dict:
    """Submit `case`'s job, wait until its ranks pause at the phase, signal it as Slurm would, wait until every rank
    recorded the signal (or, before the handlers, the job ended), let them go; the job's end state and log."""
    d, out = tmp / case.name, tmp / case.name / "out"
    (d / "pause").mkdir(parents=True)
    if case.resumed:
        shutil.copytree(resumed_from, out)
    proc = subprocess.run(["sbatch", "--parsable", "-o", str(d / "log"), "--nodes=1", "--ntasks-per-node=2",
                           *case.sbatch, SCRIPT, "bert-tiny", "--set",
                           *settings(data, out, "train.steps=3", "checkpoint.keep=0", *case.more)],
                          capture_output=True, text=True, cwd=d, timeout=60,
                          env={**env(slurm, case.launcher),
                               "PTM_TEST_PAUSE": f"{case.phase}{',exit@1' if case.late else ''}:{d / 'pause'}"})
    job = proc.stdout.strip().split(";")[0]
    if "--hold" in case.sbatch:  # what a run of this job killed outright (SIGKILL) on this host leaves
        stale = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"ptm-{job}.killed"
        stale.mkdir()
        (stale / "status").write_text("75")
        subprocess.run(["scontrol", "release", job], env=slurm.env, check=True)
    paused = lambda prefix: len(list((d / "pause").glob(prefix + ".*")))  # noqa: E731
    try:
        wait_until(lambda: paused(case.phase.split("@")[0]) == (1 if "@" in case.phase else 2), timeout=600,
                   what=f"{case.name}'s ranks at {case.phase}")
        if case.signal == "TERM":
            subprocess.run(["scancel", job], env=slurm.env, check=True)
        else:  # what --signal=B:USR1@N does: the batch shell alone; slurm/pretrain.sbatch forwards it to the ranks
            subprocess.run(["scancel", "--batch", "--signal=USR1", job], env=slurm.env, check=True)
        ended = ("FAILED", "COMPLETED", "CANCELLED", "TIMEOUT", "GONE")
        if case.phase.startswith("start"):
            wait_until(lambda: job_state(slurm, job) in ended, timeout=120, what=f"{case.name} to end")
        else:
            wait_until(lambda: paused("signalled") == 2, timeout=120, what=f"{case.name}'s ranks to get the signal")
        (d / "pause" / f"go.{case.phase.split('@')[0]}").touch()
        wait_until(lambda: job_state(slurm, job) in (*ended, "REQUEUED", "PENDING"), timeout=300,
                   what=f"{case.name} to end or requeue")
        info = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True,
                              env=slurm.env).stdout
    finally:
        subprocess.run(["scancel", job], env=slurm.env)
    field = lambda name: info.split(f"{name}=", 1)[1].split()[0] if f"{name}=" in info else None  # noqa: E731
    return {"state": field("JobState"), "exit": field("ExitCode"), "restarts": field("Restarts"), "out": out,
            "log": (d / "log").read_text(), "late": (d / "pause" / "exit.1").exists()}


@pytest.fixture(scope="module")
def stopped(slurm, train_data, torchrun_reference, tmp_path_factory):
    """Every case of STOPS, four jobs at a time; a case that went wrong on the way holds its error."""
    tmp = tmp_path_factory.mktemp("stops")

    def case(c: Stop) -> dict:
        try:
            return stopped_job(slurm, train_data, tmp, torchrun_reference, c)
        except AssertionError as e:
            log = tmp / c.name / "log"
            return {"error": f"{e}\n{log.read_text()[-3000:] if log.exists() else ''}"}

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return dict(zip((c.name for c in STOPS), pool.map(case, STOPS)))


@pytest.mark.parametrize("case", STOPS, ids=lambda c: c.name)
def test_a_stop_signal_at_any_moment_ends_requeued_or_with_the_one_line_stop(stopped, case):
    """slurm/pretrain.sbatch (--signal=B:USR1@N) under srun, the deepspeed launcher and mpirun, a stop signal at each
    phase of start-up (before ptm's handlers, during imports, while a child process runs as a build would, while
    data-loader workers start), inside a collective, during evaluation, during a checkpoint write, at the last step,
    and scancel's SIGTERM (under mpirun too, which it ends with the ranks' output), also with a rank still ending as
    the others exit (the launcher kills it and reports that): the job ends in exit 5 with the one line naming the
    time limit, the lead and the fix, or in a complete checkpoint, exit 75 and a requeue (a cancelled job: its
    checkpoint and line); never FAILED otherwise, never "lost contact", never a traceback, never a build; each
    rank's torch threads are its share of the allocation's CPUs."""
    got = stopped[case.name]
    assert "error" not in got, got.get("error")
    log, out = got["log"], got["out"]
    assert "lost contact" not in log and "Traceback" not in log, log[-3000:]
    assert not [line for line in log.splitlines() if "built successfully" in line or "Building extension" in line
                or "ninja" in line], log[-3000:]
    threads = 2 if "--cpus-per-task=2" in case.sbatch else 1  # (torch alone would take both cores here)
    assert f"OMP_NUM_THREADS={threads} per task" in log
    errors = [line for line in log.splitlines() if line.startswith("pretrain: error:")]
    assert got["late"] == case.late, log[-3000:]  # (rank 1 was still ending as rank 0 exited: the launcher killed it)
    if case.outcome == "no-progress":
        since = "since resuming from step 6" if case.resumed else "since the job (re)started" if \
            case.phase.startswith("start") else "of the run"
        assert (got["state"], got["exit"]) == ("FAILED", "5:0") and "requeueing" not in log, (got, log[-3000:])
        assert len(errors) == 1 and errors[0].startswith(f"pretrain: error: stopped by SIGUSR1 before the first step "
                                                         f"{since}"), log[-3000:]
        assert "time limit (01:00:00)" in errors[0] and "--signal=B:USR1@LEAD" in errors[0] and "raise --time" in errors[0]
        assert latest_step(out) == (6 if case.resumed else -1) and steps_done(out) == (6 if case.resumed else 0)
    elif case.outcome == "requeued":
        assert got["state"] in ("PENDING", "REQUEUED", "RUNNING") and got["restarts"] == "1", (got, log[-3000:])
        assert f"stopped by SIGUSR1 at step {case.step}: " in log and "requeueing job" in log and not errors, log[-3000:]
        assert latest_step(out) == case.step and C.Pieces(C.resolve(str(out))).meta["step"] == case.step
        assert json.load(open(out / "launch.json"))["threads_per_rank"] == threads
    elif case.outcome == "completed":
        assert (got["state"], got["exit"]) == ("COMPLETED", "0:0") and not errors, (got, log[-3000:])
        assert not end_dirs(log)  # (its own and, held back before it ran, the one a killed run had left: "--hold")
        assert latest_step(out) == summary(out)["steps"] == case.step
    elif case.step:  # cancelled where the ranks had a step to checkpoint at (under mpirun, which scancel ends at
        # once with the ranks' output: the script says their line)
        assert got["state"] == "CANCELLED" and "requeueing" not in log and not errors, (got, log[-3000:])
        assert f"stopped by SIGTERM at step {case.step}: " in log and latest_step(out) == case.step, log[-3000:]
    else:
        assert got["state"] == "CANCELLED" and "requeueing" not in log, (got, log[-3000:])
        assert len(errors) <= 1 and all(e.startswith("pretrain: error: stopped by SIGTERM before the first step")
                                        for e in errors), log[-3000:]
        assert latest_step(out) == -1


def test_scancel_checkpoints_when_there_is_time_and_a_resubmission_resumes(slurm, train_data, long_reference,
                                                                            tmp_path):
    """scancel mid-run (SIGTERM to every task, SIGKILL after KillWait=5 s): the tasks, and their data loader
    workers, get to a checkpoint at the step they agree on; resubmitted, the job resumes there and ends
    bit-identical to the uninterrupted job."""
    out = tmp_path / "cancelled"
    args = [*NODES, SCRIPT, "bert-tiny", "--set", *settings(train_data, out, *LONG, "checkpoint.interval=1000",
                                                               "data.num_workers=1")]
    proc, _ = sbatch(slurm, tmp_path / "cancelled.log", *args, wait=False)
    job = proc.stdout.strip().split(";")[0]
    wait_until(lambda: steps_done(out) >= 5, what="5 training steps")
    subprocess.run(["scancel", job], env=slurm.env, check=True)
    wait_until(lambda: job_state(slurm, job) in ("CANCELLED", "COMPLETED", "FAILED", "GONE"), what="the job to end")
    stopped = latest_step(out)
    assert stopped >= 5, open(tmp_path / "cancelled.log").read()[-3000:]  # no periodic checkpoint: the SIGTERM's
    proc, log = sbatch(slurm, tmp_path / "resubmitted.log", *args)
    assert proc.returncode == 0, log[-3000:]
    assert summary(out)["resumed_from"]["step"] == stopped
    assert_same_checkpoints(out, long_reference)


def test_a_killed_task_ends_the_job_naming_it_and_a_resubmission_resumes(slurm, train_data, long_reference,
                                                                          tmp_path):
    """SIGKILL of one task (rank 3): srun ends the whole job within seconds, its log names the task; resubmitted,
    the job resumes from the last periodic checkpoint and ends bit-identical to the uninterrupted job."""
    out = tmp_path / "killed"
    args = [*NODES, SCRIPT, "bert-tiny", "--set", *settings(train_data, out, *LONG)]
    proc, _ = sbatch(slurm, tmp_path / "killed.log", *args, wait=False)
    job = proc.stdout.strip().split(";")[0]
    wait_until(lambda: latest_step(out) >= 40, what="the first periodic checkpoint")
    ranks = [p for p in psutil.process_iter(["cmdline", "environ"])
             if str(out) in " ".join(p.info["cmdline"] or []) and (p.info["environ"] or {}).get("SLURM_PROCID") == "3"
             and "pretrain" in " ".join(p.info["cmdline"] or [])]
    assert ranks, "no task with SLURM_PROCID=3 found"
    killed = time.time()
    ranks[0].send_signal(signal.SIGKILL)
    wait_until(lambda: job_state(slurm, job) in ("FAILED", "COMPLETED", "CANCELLED", "GONE"), timeout=120,
               what="the job to fail")
    assert time.time() - killed < 90 and job_state(slurm, job) == "FAILED"
    log = open(tmp_path / "killed.log").read()
    assert "task 3" in log and "Killed" in log, log[-3000:]
    resumed_from = latest_step(out)
    proc, log = sbatch(slurm, tmp_path / "resubmitted.log", *args)
    assert proc.returncode == 0, log[-3000:]
    assert summary(out)["resumed_from"]["step"] == resumed_from >= 40
    assert_same_checkpoints(out, long_reference)


def test_ptm_launch_slurm_runs_prep_train_convert(slurm, small, tmp_path):
    """`ptm launch slurm`: a tokenizer job, the data_prep array and finalize, 2-node training, the HF export, each
    after the one before succeeded; transformers loads the result."""
    import transformers

    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "launchers", "slurm", small["path"], "--data", str(tmp_path / "data"),
                           "--vocab-size", "2000", "--partitions", "2", "--config", "bert-tiny", "--set",
                           *settings(tmp_path / "data", out)[1:], "--nodes", "2", "--ntasks-per-node", "2", "--wait"],
                          capture_output=True, text=True, env=env(slurm), cwd=str(tmp_path), timeout=900)
    logs = "".join(p.read_text() for p in [*tmp_path.rglob("slurm-*.out"), *tmp_path.glob("*.out")])
    assert proc.returncode == 0, proc.stdout + proc.stderr + logs[-4000:]
    assert [line.split(":")[0] for line in proc.stdout.splitlines()[:5]] == ["tokenizer", "prep", "finalize", "train",
                                                                            "convert"]
    assert run_cli("data_prep", "verify", tmp_path / "data").returncode == 0
    assert summary(out)["layout"]["dp"] == 2
    model = transformers.AutoModelForPreTraining.from_pretrained(out / "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(out / "hf")
    assert model.config.hidden_size == 128 and len(tokenizer("hello world")["input_ids"]) > 2
