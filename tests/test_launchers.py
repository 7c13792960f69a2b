"""The rendezvous contract (launchers/): every launcher's variables become torch's; inconsistent environments are
one line naming the variable; `ptm launch env|hostfile|master` inside a real Slurm job; an unreachable master, a
stalled rank and a stalled store end the run after parallel.timeout_s in one line naming the rank and host (exit 4)."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import ROOT, free_port, run_cli
from launchers.rendezvous import RendezvousError, detect, export, tasks_per_node


def test_torch_variables_win_and_open_mpi_and_mpich_map_to_them():
    env = {"RANK": "3", "WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}
    assert export(env) == "torchrun/deepspeed" and env["RANK"] == "3"
    assert export({}) is None and export({"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"}) is None
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "node1"}
    assert export(env) == "mpirun (Open MPI)"
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"],
            env["MASTER_ADDR"], env["MASTER_PORT"]) == ("3", "4", "1", "2", "1", "node1", "29500")
    env = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert export(env) == "mpiexec (MPICH/Intel MPI)" and (env["RANK"], env["MASTER_ADDR"]) == ("1", "127.0.0.1")
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]


SRUN_TASK_5 = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_TASKS": "8",
               "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "1",
               "MASTER_ADDR": "n1", "MASTER_PORT": "21234"}


@pytest.mark.parametrize("env, launcher", [
    ({**SRUN_TASK_5, "PMI_RANK": "5", "PMI_SIZE": "8", "PMI_FD": "7"}, "srun"),  # srun --mpi=pmi2: no local rank
    ({"PMI_RANK": "5", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "4", "MASTER_ADDR": "n1",
      "MASTER_PORT": "21234"}, "mpiexec (Cray PALS)"),
    ({"MV2_COMM_WORLD_RANK": "5", "MV2_COMM_WORLD_SIZE": "8", "MV2_COMM_WORLD_LOCAL_RANK": "1",
      "MV2_COMM_WORLD_LOCAL_SIZE": "4", "PMI_ID": "5", "MASTER_ADDR": "n1", "MASTER_PORT": "21234"},
     "mpirun_rsh (MVAPICH)"),
    # Intel MPI's hydra under Slurm starts one proxy per node with srun: the ranks see that step's SLURM_* too
    ({**SRUN_TASK_5, "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_STEP_NUM_TASKS": "2",
      "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1",
      "MPI_LOCALNRANKS": "4"},
     "mpiexec (MPICH/Intel MPI)"),
])
def test_rank_5_of_8_on_the_second_of_two_nodes_under_each_launcher(env, launcher):
    assert export(env) == launcher
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"],
            env["MASTER_ADDR"], env["MASTER_PORT"]) == ("5", "1", "8", "4", "1", "n1", "21234")
    assert detect(env).nodes == 2


@pytest.mark.parametrize("env, expected", [
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "MASTER_ADDR"),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"},
     "OMPI_COMM_WORLD_LOCAL_SIZE=3 does not divide OMPI_COMM_WORLD_SIZE=4"),
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2",
      "SLURM_STEP_TASKS_PER_NODE": "3,1", "MASTER_ADDR": "n1"}, "every node needs the same number"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not a whole number"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 is set but RANK is not: set both"),
    ({"RANK": "1"}, "RANK=1 is set but WORLD_SIZE is not: set both"),
    ({"RANK": "5", "WORLD_SIZE": "4"}, "RANK=5 is outside 0..3 (WORLD_SIZE=4)"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE=0 must be 1 or more"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "0"},
     "OMPI_COMM_WORLD_LOCAL_SIZE=0 must be 1 or more"),
    ({"PMI_RANK": "-1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0"}, "PMI_RANK=-1 is outside 0..1 (PMI_SIZE=2)"),
    ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
     "MASTER_ADDR is not set; run mpiexec -genv MASTER_ADDR <first host> -genv MASTER_PORT <port> ..."),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "PMI_FD": "7"},
     "PMI_SIZE=2 says an MPI launcher started 2 processes, but none"),
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "4", "SLURM_STEP_NUM_TASKS": "4", "MASTER_ADDR": "n1"},
     "SLURM_PROCID=4 is outside 0..3 (SLURM_STEP_NUM_TASKS=4)"),
])
def test_inconsistent_environments_are_one_line(env, expected):
    with pytest.raises(RendezvousError) as e:
        export(env)
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_a_batch_script_is_not_a_task():
    """In the batch script SLURM_PROCID=0 and SLURM_NTASKS=4 are set too, but no job step: one process, alone."""
    assert detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n[1-2]"}) is None


def test_launch_env_hostfile_and_master_inside_a_slurm_job(slurm, tmp_path):
    """srun on 2 nodes x 2 tasks: each task's `ptm launch env` has its rank, local rank and node, and all share the
    master: the first node's NodeAddr (n1 does not resolve here) and the job's port; the batch script writes a
    deepspeed hostfile of the allocation."""
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
{sys.executable} -m launchers hostfile --out {tmp_path}/hostfile
{sys.executable} -m launchers master > {tmp_path}/master
srun bash -c '{sys.executable} -m launchers env > {tmp_path}/env-$SLURM_PROCID.json'
""")
    proc = subprocess.run(["sbatch", "--wait", "--nodes=2", "--ntasks-per-node=2", "-o", str(tmp_path / "log"),
                           str(script)], capture_output=True, text=True, env=slurm.env, timeout=300)
    assert proc.returncode == 0, (tmp_path / "log").read_text()
    job = int(proc.stdout.split()[-1])
    seen = [json.loads((tmp_path / f"env-{r}.json").read_text()) for r in range(4)]
    assert [(s["rank"], s["local_rank"], s["node_rank"]) for s in seen] == [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
    assert {(s["launcher"], s["world_size"], s["nodes"], s["local_world_size"], s["master_addr"], s["master_port"])
            for s in seen} == {("srun", 4, 2, 2, "127.0.0.1", str(20000 + job % 20000))}
    assert (tmp_path / "hostfile").read_text() == "n1 slots=2\nn2 slots=2\n"
    assert (tmp_path / "master").read_text().split() == ["127.0.0.1", str(20000 + job % 20000)]
    assert run_cli("launchers", "hostfile", "--out", tmp_path / "h", check=False).returncode == 2  # not in a job


def test_the_deepspeed_launcher_without_ssh_one_invocation_per_node(tmp_path):
    """`deepspeed --hostfile H --no_ssh --node_rank N ...` started on each of two (simulated) nodes: each process
    learns its rank, node and the job's size from what launch.py sets (LOCAL_SIZE, CROSS_RANK)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", str(hostfile), "--no_ssh",
                               "--node_rank", str(n), "--master_addr", "127.0.0.1", "--master_port", port, "--module",
                               "launchers", "env"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for n in (0, 1)]
    seen = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0
        seen.append(json.loads(re.search(r"^\{$.*?^\}$", out, re.M | re.S).group()))  # among launch.py's log lines
    assert [(s["rank"], s["node_rank"], s["nodes"], s["local_world_size"], s["world_size"]) for s in seen] == \
        [(0, 0, 2, 1, 2), (1, 1, 2, 1, 2)]


def test_an_unreachable_master_ends_the_rank_after_the_timeout_naming_it(train_data, tmp_path):
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "pretrain", "train", "--config", "bert-tiny", "--set",
                           f"data.path={train_data}", "parallel.timeout_s=5", f"out_dir={tmp_path}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4 and time.time() - start < 60, proc.stderr[-2000:]
    assert f"pretrain: error: rank 1 on {socket.gethostname()} lost contact" in proc.stderr


def test_a_master_port_in_use_is_one_line_not_a_lost_contact(train_data, tmp_path):
    """Rank 0 cannot listen on MASTER_PORT (another process holds it): one line naming the port, the host and the
    fix, exit 2, at once."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        proc = subprocess.run([sys.executable, "-m", "pretrain", "train", "--config", "bert-tiny", "--set",
                               f"data.path={train_data}", "parallel.timeout_s=30", f"out_dir={tmp_path}"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == f"pretrain: error: MASTER_PORT {port} is in use on " \
        f"{socket.gethostname()}: set MASTER_PORT to a free port (mpirun -x MASTER_PORT=..., torchrun --master_port " \
        "...)\n", proc.stderr[-2000:]


def test_ptm_launch_torchrun_ends_with_the_ranks_line_and_status_and_reports_a_failed_rank(train_data, tmp_path):
    """SIGTERM to `ptm launch torchrun` (as `kill` or Slurm sends it) mid-run on one of two (simulated) nodes, SIGUSR1
    on the other (Slurm's warning, which kills plain torchrun): torchrun passes them to the ranks, they checkpoint at
    a step boundary, and it ends with their line and exit 75, not torchrun's SignalException traceback and exit 1
    (plain torchrun's); on the node without rank 0, which says the line, with one line of its own. A worker that
    fails otherwise, though another noted 75, is still torchrun's report (ChildFailedError naming the rank and its
    exit status) and exit 1."""
    launch = [sys.executable, "-m", "launchers", "torchrun"]
    torchrun = [*launch, "--nproc_per_node", "2", f"--master_port={free_port()}"]
    run, port = tmp_path / "run", free_port()
    procs = [subprocess.Popen([*launch, "--nnodes", "2", "--node-rank", str(node), "--nproc_per_node", "1",
                               "--master_addr", "127.0.0.1", f"--master_port={port}", "-m", "pretrain", "train",
                               "--config", "bert-tiny", "--set", f"data.path={train_data}", "data.num_workers=0",
                               "data.seq_len=32", "model.max_position_embeddings=32", "train.global_batch_size=4",
                               "train.micro_batch_size=2", "train.steps=100000", "train.eval_interval=0",
                               "checkpoint.interval=0", f"out_dir={run}"],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for node in (0, 1)]
    try:
        deadline = time.time() + 300
        while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text():
            assert all(p.poll() is None for p in procs) and time.time() < deadline, \
                "".join(p.stderr.read()[-3000:] for p in procs if p.poll() is not None)
            time.sleep(0.2)
        for proc, stop in zip(procs, (signal.SIGTERM, signal.SIGUSR1)):
            proc.send_signal(stop)
        err, other = (proc.communicate(timeout=120)[1] for proc in procs)
    finally:
        for proc in procs:
            proc.kill()
    said = re.search(r"\npretrain: stopped by (?:SIGTERM|a signal to another rank) at step (\d+): (\S+) written; "
                     r"exit 75: .*\n$", err)  # (rank 0's own, or rank 1's first)
    assert procs[0].returncode == 75 and said and "Traceback" not in err, err[-3000:]
    assert said[2] == str(run / "checkpoints" / f"step_{int(said[1]):08d}") and os.path.isdir(said[2])
    assert procs[1].returncode == 75 and "Traceback" not in other and other.endswith(
        f"\nlaunchers: the ranks on {socket.gethostname()} stopped on SIGUSR1 as the job's ranks agreed (exit 75); "
        "rank 0's node says why\n"), other[-3000:]
    failed = subprocess.run([*torchrun, "--no-python", "sh", "-c",
                             'echo 75 > "$PTM_END_NOTE"; [ "$RANK" = 1 ] && exit 1; exec sleep 600'],
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and "ChildFailedError" in failed.stderr, failed.stderr[-3000:]
    assert re.search(r"rank +: 1 \(local_rank: 1\)\n +exitcode +: 1 ", failed.stderr), failed.stderr[-3000:]


def test_ptm_launch_torchrun_reads_the_note_of_the_attempt_that_ended(tmp_path):
    """With --max-restarts, ranks that noted 75 and exited (checkpointed on a stop signal) are restarted; SIGTERM
    to the launcher before the new ranks noted anything is a stop they could not checkpoint for (143, its line), not
    the earlier attempt's 75."""
    proc = subprocess.Popen([sys.executable, "-m", "launchers", "torchrun", "--nproc_per_node", "2", "--max-restarts",
                             "1", "--monitor-interval", "0.1", f"--master_port={free_port()}", "--no-python", "sh",
                             "-c", '[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && { echo 75 > "$PTM_END_NOTE"; exit 75; }; '
                             f'touch {tmp_path}/again.$RANK; exec sleep 600'],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not all((tmp_path / f"again.{rank}").exists() for rank in (0, 1)):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-3000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143 and "launchers: stopped by SIGTERM before the ranks could checkpoint" in err, \
        err[-3000:]

def test_each_torchrun_attempt_has_a_store_of_its_own(monkeypatch):
    """torchrun's agent keeps its rendezvous store across --max-restarts attempts (torch 2.13): what a rank of attempt
    0 posted there (a heartbeat's verdict) is not what attempt 1's ranks read, through `init_processes` as a run
    starts; without the agent's store (rank 0 keeps a new one every start) the store is as it was."""
    import torch.distributed as dist

    from pretrain.parallel import mcore

    agent = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for name, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", NODE_RANK="0",
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(agent.port),
                            TORCHELASTIC_USE_AGENT_STORE="True").items():
        monkeypatch.setenv(name, value)
    mcore.shutdown()  # (a one-process group another test left in this process)
    try:
        for attempt in "01":
            monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", attempt)
            mcore.init_processes(timeout_s=30)
            store = dist.distributed_c10d._get_default_store()
            assert not store.check(["ptm/heartbeat/1/verdict"]), f"attempt {attempt} reads an earlier one's verdict"
            store.set("ptm/heartbeat/1/verdict", "rank 1 lost contact")
            mcore.shutdown()
    finally:
        mcore.shutdown()
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE")
    assert mcore.attempt_store(agent) is agent


def test_nodes_with_different_numbers_of_ranks_stop_where_the_ranks_meet(monkeypatch):
    """torchrun --nproc-per-node 2 on one node and 1 on another (or mpirun 4 + 2 + 2): each rank sees only its node's
    LOCAL_WORLD_SIZE, so `init_processes` compares them in the rendezvous store; every rank stops with one line."""
    import threading

    import torch.distributed as dist

    from pretrain.parallel import mcore

    def rank(local_size: int, said: list) -> None:  # a rank of the same job, on its own connection
        store = dist.PrefixStore("ptm/attempt0", dist.TCPStore("127.0.0.1", agent.port, is_master=False))
        try:
            mcore.check_even_nodes(store, 3, local_size, "torchrun/deepspeed")
        except RendezvousError as e:
            said.append(str(e))

    agent = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for name, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="3", LOCAL_WORLD_SIZE="2", NODE_RANK="0",
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(agent.port), TORCHELASTIC_USE_AGENT_STORE="True",
                            TORCHELASTIC_RESTART_COUNT="0").items():
        monkeypatch.setenv(name, value)
    mcore.shutdown()
    said = []
    others = [threading.Thread(target=rank, args=(size, said), daemon=True) for size in (2, 1)]  # ranks 1 and 2
    for thread in others:
        thread.start()
    with pytest.raises(RendezvousError) as e:
        mcore.init_processes(timeout_s=30)
    for thread in others:
        thread.join(timeout=30)
    assert said == [str(e.value)] * 2 and str(e.value) == "torchrun/deepspeed started [2, 1] tasks on its 2 nodes " \
        "(LOCAL_WORLD_SIZE=2 and 1); every node needs the same number: start as many on each (torchrun " \
        "--nproc-per-node, mpirun --map-by ppr:N:node, srun --ntasks-per-node)"
    assert not dist.is_initialized()


BUSY_THEN_TRAIN = """import os, sys, time
from pretrain.config import load
from pretrain.train import Trainer
trainer = Trainer(load("bert-tiny", sys.argv[2:]))
if os.environ["RANK"] == "1":
    time.sleep(float(sys.argv[1]))  # the main thread busy (a long checkpoint write) while rank 0 waits: no verdict
    hang, to_device = os.environ.get("HANG_WHILE"), trainer._to_device

    def loading(batch):  # once HANG_WHILE exists, the main thread hangs loading a step's batches (threads beat on)
        while hang and os.path.exists(hang):
            time.sleep(0.1)
        return to_device(batch)

    trainer._to_device = loading
trainer.fit()
"""


@pytest.mark.parametrize("stopped, survivor_says", [
    (1, "rank 0 on {host} lost contact with the other ranks (rank 1 on {host} has not been heard from for"),
    (0, "rank 1 on {host} lost contact with the other ranks (the rendezvous store at 127.0.0.1:{port}, kept by rank 0, "
        "has not answered for"),
    # 18 s (2 x timeout_s - 2 beats) and a beat or two more on a loaded machine, before any collective's 23 s
    ("hung", r"rank 0 on {host} lost contact with the other ranks \(it has waited (?:1[89]|2[012]) s at step (\d+): "
             r"counting its loss elements over the data-parallel ranks for rank 1 on {host}, still at step \1: "
             r"loading its micro-batches\)"),
])
def test_a_stalled_rank_is_named_by_the_heartbeat_before_any_collective_times_out(train_data, tmp_path, stopped,
                                                                                 survivor_says):
    """Two ranks (as mpirun or srun start them: rank 0 keeps the store), one SIGSTOPped mid-run (all its threads stop,
    as on a hung host): the other says so in one line and exits 4 after parallel.timeout_s, from the heartbeat, not from
    a backend timeout (collectives wait 2 x timeout_s + 3 beats), so NCCL's watchdog would not get there first. A rank
    whose main thread is busy longer than timeout_s (but beats) is not called silent. "hung": rank 1's main thread
    hangs loading a step's batches while its threads beat on (a stuck loader or device): rank 0, waiting in that step's
    first collective, names it and where it is, 2 x timeout_s - 2 beats after its own last mark, and both exit 4."""
    port, host, timeout_s = free_port(), socket.gethostname(), 10
    overrides = [f"data.path={train_data}", "data.num_workers=0", "data.seq_len=32", "model.max_position_embeddings=32",
                 "train.global_batch_size=4", "train.micro_batch_size=2", "train.steps=100000", "train.eval_interval=0",
                 "checkpoint.interval=0", f"parallel.timeout_s={timeout_s}", "parallel.heartbeat_s=1",
                 f"out_dir={tmp_path}"]
    busy, hang = 1.5 * timeout_s if stopped == 1 else 0, tmp_path / "hang"
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "HANG_WHILE": str(hang)}
        with open(tmp_path / f"stderr-{rank}", "w") as err:
            procs.append(subprocess.Popen([sys.executable, "-c", BUSY_THEN_TRAIN, str(busy), *overrides], cwd=ROOT,
                                          env=env, stdout=subprocess.DEVNULL, stderr=err))
    survivor = procs[0 if stopped == "hung" else 1 - stopped]
    try:
        metrics, deadline = tmp_path / "metrics.jsonl", time.time() + 300
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):  # steps after the busy spell
            assert all(p.poll() is None for p in procs) and time.time() < deadline, \
                (tmp_path / "stderr-0").read_text()[-3000:] + (tmp_path / "stderr-1").read_text()[-3000:]
            time.sleep(0.2)
        if stopped == "hung":
            hang.touch()
            procs[1].wait(timeout=180)
            assert procs[1].returncode == 4  # it reads the verdict posted by rank 0
        else:
            procs[stopped].send_signal(signal.SIGSTOP)
        survivor.wait(timeout=180)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    stderr = (tmp_path / f"stderr-{0 if stopped == 'hung' else 1 - stopped}").read_text()
    assert survivor.returncode == 4, stderr[-3000:]
    says = survivor_says.format(host=host, port=port)
    if stopped == "hung":
        assert re.search(f"pretrain: error: {says}", stderr), stderr[-3000:]
    else:
        assert f"pretrain: error: {says}" in stderr, stderr[-3000:]
    said = json.load(open(tmp_path / "failed.json"))  # (the judge keeps its line in out_dir; a rank's, the first)
    assert said["exit"] == 4 and said["error"] in [line for rank in (0, 1)
                                                   for line in (tmp_path / f"stderr-{rank}").read_text().splitlines()]


def test_a_stalled_main_thread_names_the_ranks_still_behind_it():
    """The census a stalled main thread's judge reads: ranks at an earlier mark are named with their host and point
    (four at most, then a count); with none behind, every rank waits at one point; a rank behind others, or at a
    patient mark (a checkpoint write), or stalled for less than stall_s, gives no verdict. Ranks 1-6 are this test
    writing their marks, hosts and beats into a real store."""
    from datetime import timedelta

    import torch.distributed as dist

    from pretrain.heartbeat import Heartbeat

    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=timedelta(seconds=5))
    for rank, mark in enumerate(["", "1 step 1: loading its micro-batches", *["2 step 1: micro-batch 1 of 2"] * 5]):
        if rank:
            store.set(f"t/host/{rank}", f"node{rank}")
            store.set(f"t/mark/{rank}", mark)
    beat = Heartbeat(store, rank=0, world=7, timeout_s=60, interval_s=0.02, prefix="t", stall_s=0.3)
    beat.stop()  # its judge would end this process: the verdicts are asked for below
    try:
        for point in ("step 1: loading its micro-batches", "step 1: micro-batch 1 of 2", "step 1: micro-batch 2 of 2"):
            beat.progressed(point)
        beat.census = (beat.mark, beat._read_marks(store))
        assert beat.stalled(beat.mark[2] + 0.2) is None  # not yet stall_s at one mark
        verdict = beat.stalled(beat.mark[2] + 0.4)
        assert re.fullmatch(r"it has waited 0 s at step 1: micro-batch 2 of 2 for rank 1 on node1, still at step 1: "
                            r"loading its micro-batches; rank 2 on node2, still at step 1: micro-batch 1 of 2; "
                            r"rank 3 on node3, .*; rank 4 on node4, .* and 2 more", verdict), verdict
        beat.census = (beat.mark, [(r, beat.mark[0], "step 1: micro-batch 2 of 2", f"node{r}") for r in range(7)])
        assert beat.stalled(beat.mark[2] + 0.4).startswith("every rank has waited 0 s at step 1: micro-batch 2 of 2: a "
                                                           "collective has not completed")
        beat.census = (beat.mark, [(1, 5, "step 2: loading its micro-batches", "node1")])
        assert beat.stalled(beat.mark[2] + 0.4) is None  # this rank is the one behind: the others name it
        beat.progressed("the checkpoint of step 1", patient=True)
        beat.census = (beat.mark, [])
        assert beat.stalled(beat.mark[2] + 60) is None
    finally:
        store.delete_key("t/1")


def test_the_heartbeat_threads_end_with_stop():
    """A Trainer's close (and the process group's end) stops both threads: none outlives the run to judge a peer
    that has finished. Here the peer (rank 1) is this test writing its counter into a real store."""
    from datetime import timedelta

    import torch.distributed as dist

    from pretrain.heartbeat import Heartbeat

    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=timedelta(seconds=5))
    store.set("t/host/1", "node7")
    beat = Heartbeat(store, rank=0, world=2, timeout_s=60, interval_s=0.05, prefix="t")
    while beat.count is None or store.add("t/0", 0) < 2:
        store.add("t/1", 1)
        time.sleep(0.05)
    assert beat.count >= 1 and beat.verdict(time.monotonic()) is None
    assert all(t.is_alive() for t in beat._threads)
    beat.stop()
    assert not any(t.is_alive() for t in beat._threads)
    beat.heard -= 61  # what the judge would say of a silent peer, and of a silent store
    assert beat.verdict(beat.answered) == "rank 1 on node7 has not been heard from for 61 s"
    assert re.fullmatch(r"the rendezvous store at \S+, kept by rank 0, has not answered for 61 s",
                        beat.verdict(beat.answered + 61))


@pytest.fixture
def fake_slurm(tmp_path):
    """sbatch, scontrol and scancel as shell scripts on PATH, for the Slurm scripts' and `ptm launch slurm`'s own
    logic: sbatch logs its arguments to calls.log and prints job ids 41, 42, ... (or fails naming an argument that
    contains `=bad`); `scontrol show job -o N` says `state-N` (default COMPLETED; PURGED: a job Slurm has forgotten,
    "Invalid job id"); `scontrol show hostnames` says
    `hostnames`; scancel, srun and mpirun log. Returns (env, directory)."""
    d = tmp_path / "fake-slurm"
    d.mkdir()
    scripts = {
        "sbatch": f"""echo "sbatch $*" >> {d}/calls.log
case " $* " in *=bad*) echo "sbatch: error: invalid option ($*)" >&2; exit 1;; esac
n=$(grep -c '^sbatch' {d}/calls.log); echo $((40 + n))""",
        "scontrol": f"""echo "scontrol $*" >> {d}/calls.log
case $2 in
  job) state=$(cat {d}/state-$4 2>/dev/null || echo COMPLETED)
       [ "$state" != PURGED ] || {{ echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }}
       echo "JobId=$4 JobState=$state Reason=None" ;;
  hostnames) case $3 in *bad*) echo "scontrol: error: Unable to create hostlist from $3" >&2; exit 1;; esac
             cat {d}/hostnames ;;
  *) exit 1 ;;
esac""",
        "scancel": f'echo "scancel $*" >> {d}/calls.log',
        "srun": f'echo "srun $* (MASTER_ADDR=${{MASTER_ADDR:-}} MASTER_PORT=${{MASTER_PORT:-}} '
                f'SRUN_CPUS_PER_TASK=${{SRUN_CPUS_PER_TASK:-}})" >> {d}/calls.log',
        "mpirun": f'echo "mpirun $*" >> {d}/calls.log'}
    for name, body in scripts.items():
        (d / name).write_text("#!/usr/bin/env bash\n" + body + "\n")
        (d / name).chmod(0o755)
    return {**os.environ, "PATH": f"{d}:{os.environ['PATH']}", "PTM_PYTHON": sys.executable}, d


def test_a_ptm_python_command_line_is_split_by_every_script_and_the_chain(fake_slurm, tmp_path):
    """PTM_PYTHON="apptainer exec --nv ptm.sif python" (what slurm/pretrain.sbatch suggests) is a command line to
    prep.sbatch and convert.sbatch, and in the --wrap jobs `ptm launch slurm` submits, not one quoted word."""
    env, d = fake_slurm
    (d / "apptainer").write_text(f'#!/usr/bin/env bash\necho "$*" >> {d}/apptainer.log\n')
    (d / "apptainer").chmod(0o755)
    env = {**env, "PTM_PYTHON": "apptainer exec --nv ptm.sif python"}
    for script, args in (("prep.sbatch", ["OUT", "in.jsonl", "--tokenizer", "T"]), ("convert.sbatch", ["RUN"])):
        proc = subprocess.run(["bash", os.path.join(ROOT, "slurm", script), *args], capture_output=True, text=True,
                              env={**env, "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_ID": "1"}, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    assert [line.split(" -m ")[0] for line in (d / "apptainer.log").read_text().splitlines()] == \
        ["exec --nv ptm.sif python"] * 3
    proc = chain(env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    wraps = [c.split("--wrap ")[1] for c in (d / "calls.log").read_text().splitlines() if "--wrap" in c]
    assert [w.split(" -m ")[0] for w in wraps] == ["apptainer exec --nv ptm.sif python"] * 2, wraps
    proc = chain({**env, "PTM_PYTHON": "'python"}, tmp_path)
    assert proc.returncode == 2 and proc.stderr == \
        "launchers: error: PTM_PYTHON=\"'python\": No closing quotation; fix its quotes\n", proc.stderr


@pytest.mark.parametrize("failed, says", [
    ("42", "array job 41 failed (finalize job 42 cancelled); see {out}/slurm-prep-41_*.out"),
    (None, None)])
def test_prep_sh_wait_fails_when_the_finalize_job_did_not_complete(fake_slurm, tmp_path, failed, says):
    """`sbatch --wait` returns 0 for a job cancelled because its dependency failed: `prep.sh --wait` judges the
    finalize job's state, and names the failed array job and its logs."""
    env, d = fake_slurm
    if failed:
        (d / f"state-{failed}").write_text("CANCELLED")
    out = tmp_path / "outp"
    proc = subprocess.run(["bash", os.path.join(ROOT, "slurm", "prep.sh"), "--wait", "2", str(out), "missing.jsonl",
                           "--tokenizer", "T"], capture_output=True, text=True, env=env)
    assert "--wait" in (d / "calls.log").read_text()
    if failed:
        assert proc.returncode == 1 and proc.stderr.strip().endswith(says.format(out=out)), proc.stderr
    else:
        assert proc.returncode == 0 and f"dataset {out} finalized" in proc.stdout, proc.stderr


def chain(env, tmp_path, *more, corpus=None):
    """`python -m launchers slurm` against fake_slurm: the CompletedProcess."""
    if corpus is None:
        corpus = tmp_path / "corpus.jsonl"
        corpus.write_text('{"text": "hello"}\n')
    return subprocess.run([sys.executable, "-m", "launchers", "slurm", str(corpus), "--data", str(tmp_path / "D"),
                           "--config", "bert-tiny", "--set", f"out_dir={tmp_path / 'run'}", *more],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)


def test_the_chain_checks_its_inputs_and_names_its_first_failed_job(fake_slurm, tmp_path):
    """A missing input or --tokenizer is one line before anything is submitted; with --wait, a chain whose prep array
    failed (finalize, train and convert cancelled after it) names the prep job and its logs."""
    env, d = fake_slurm
    (tmp_path / "empty").mkdir()
    for more, corpus, what in [((), "nothing.jsonl", f"input not found: {tmp_path / 'nothing.jsonl'}; check the path "
                                "(directories and globs are accepted)"),
                               ((), "empty", f"input directory {tmp_path / 'empty'} holds no .txt/.jsonl/.parquet/"
                                ".arrow files; point at the files or pass --format"),
                               (("--tokenizer", "nowhere"), None, "--tokenizer nowhere not found")]:
        proc = chain(env, tmp_path, *more, corpus=corpus and tmp_path / corpus)
        assert proc.returncode == 2 and proc.stderr == f"launchers: error: {what}; nothing was submitted\n"
        assert not (d / "calls.log").exists()
    (d / "state-41").write_text("PURGED")  # (the tokenizer job ended long before: Slurm no longer knows it)
    (d / "state-42").write_text("FAILED")
    for job in (43, 44, 45):
        (d / f"state-{job}").write_text("CANCELLED")
    proc = chain(env, tmp_path, "--wait")
    assert proc.returncode == 1 and "job 45: CANCELLED" in proc.stdout, proc.stderr
    assert proc.stderr == f"launchers: the prep job 42 ended FAILED; see {tmp_path}/D/slurm-prep-42_*.out\n"
    assert "JOBID.out" in run_cli("launchers", "slurm", "--help").stdout


def test_sbatch_options_are_taken_as_their_help_shows_them(fake_slurm, tmp_path):
    """`--train-args "--time=24:00:00"` (a value starting with `-`, which argparse takes for an option) and
    `--sbatch-args --account=A` reach sbatch."""
    env, d = fake_slurm
    proc = chain(env, tmp_path, "--train-args", "--time=24:00:00", "--sbatch-args", "--account=A --qos=long")
    assert proc.returncode == 0, proc.stderr
    calls = [c for c in (d / "calls.log").read_text().splitlines() if c.startswith("sbatch")]
    assert len(calls) == 5 and all("--account=A --qos=long" in c for c in calls)
    assert [c for c in calls if "--time=24:00:00" in c] == [calls[3]] and "pretrain.sbatch" in calls[3]


@pytest.mark.parametrize("more, path, says", [
    (("--config", "nonexist"), True, "config file nonexist not found in "),
    (("--set", "bogus=1"), True, "--set bogus=1: unknown key 'bogus'"),
    (("--data", "{tmp}/afile"), True, "--data {tmp}/afile is a file, not a directory; choose another"),
    (("--sbatch-args", "'--account=A"), True, "--sbatch-args \"'--account=A\" / --train-args '': No closing"),
    ((), False, "sbatch not found on PATH: submit from a host with Slurm's commands (a login node)")])
def test_bad_chain_arguments_are_one_line(fake_slurm, tmp_path, more, path, says):
    """A config or override that does not load, --data an existing file, unbalanced quotes, no sbatch: one line,
    exit 2, nothing submitted."""
    env, d = fake_slurm
    (tmp_path / "afile").write_text("")
    env = env if path else {**env, "PATH": os.path.dirname(sys.executable) + ":/usr/bin/env-only-nothing"}
    proc = chain(env, tmp_path, *(m.format(tmp=tmp_path) for m in more))
    assert proc.returncode == 2 and proc.stderr.startswith("launchers: error: ") and proc.stderr.count("\n") == 1, \
        proc.stderr
    assert says.format(tmp=tmp_path) in proc.stderr and not (d / "calls.log").exists()


def test_a_failed_sbatch_mid_chain_cancels_the_jobs_before_it(fake_slurm, tmp_path):
    """sbatch refusing the training job (`--train-args=--time=bad`): the tokenizer, prep and finalize jobs already
    queued are cancelled and named in the one line."""
    env, d = fake_slurm
    proc = chain(env, tmp_path, "--train-args=--time=bad")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "sbatch failed (sbatch: error: " in proc.stderr
    assert proc.stderr.endswith("; cancelled the jobs submitted before it (tokenizer 41, prep 42, finalize 43)\n"), \
        proc.stderr
    assert (d / "calls.log").read_text().splitlines()[-1] == "scancel 41 42 43"


UNEVEN = "every node needs the same number: submit with --ntasks-per-node"


def test_a_hostfile_needs_the_same_tasks_on_every_node_and_says_what_it_cannot_do(fake_slurm, tmp_path):
    """SLURM_TASKS_PER_NODE=3,1 (`sbatch -n4 -N2`): not `slots=3` for both nodes but srun's one line; an unwritable
    --out and a failing scontrol are one line too, scontrol's own reason kept."""
    env, d = fake_slurm
    (d / "hostnames").write_text("n1\nn2\n")
    env = {**env, "SLURM_JOB_NODELIST": "n[1-2]"}

    def hostfile(out, **more):
        return subprocess.run([sys.executable, "-m", "launchers", "hostfile", "--out", str(out)], cwd=ROOT,
                              capture_output=True, text=True, env={**env, **more})

    assert hostfile(tmp_path / "H", SLURM_TASKS_PER_NODE="2(x2)").returncode == 0
    assert (tmp_path / "H").read_text() == "n1 slots=2\nn2 slots=2\n"
    for out, more, says in [
            (tmp_path / "H", {"SLURM_TASKS_PER_NODE": "3,1"}, "Slurm allocated [3, 1] tasks on its 2 nodes "
                                                              f"(SLURM_TASKS_PER_NODE=3,1); {UNEVEN}"),
            ("/nonexistent/H", {}, "cannot write the hostfile /nonexistent/H (No such file or directory); choose "
                                   "another --out"),
            (tmp_path / "H", {"SLURM_JOB_NODELIST": "bad[1-"},
             "with scontrol (scontrol: error: Unable to create hostlist from bad[1-); set MASTER_ADDR")]:
        proc = hostfile(out, **more)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert "SLURM_NTASKS_PER_NODE" not in run_cli("launchers", "hostfile", "--help").stdout


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_pretrain_sbatch_refuses_uneven_tasks_per_node_under_every_launcher(fake_slurm, launcher):
    """`sbatch -n3 -N2 slurm/pretrain.sbatch`: one line and exit 2 before any launcher starts (mpirun took "2,1" for
    its ppr, and the threads came out of `cpus / 2,1`)."""
    env, d = fake_slurm
    (d / "hostnames").write_text("n1\nn2\n")
    proc = subprocess.run(["bash", os.path.join(ROOT, "slurm", "pretrain.sbatch"), "bert-tiny"], capture_output=True,
                          text=True, env={**env, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]",
                                          "SLURM_TASKS_PER_NODE": "2,1", "PTM_LAUNCHER": launcher}, timeout=120)
    assert proc.returncode == 2 and proc.stderr == "ptm: error: Slurm allocated different numbers of tasks to the " \
        f"nodes (SLURM_TASKS_PER_NODE=2,1); {UNEVEN}\n", proc.stderr
    assert not (d / "calls.log").exists() or launcher not in (d / "calls.log").read_text()


def test_a_bad_input_is_the_jobs_exit_status_2_though_srun_reports_a_rank_it_killed(fake_slurm, tmp_path):
    """One rank refuses the config and exits 2; srun (--kill-on-bad-exit) kills the ranks still ending and reports
    that kill (143): the rank's note makes the job's status the 2 the README lists for bad input."""
    env, d = fake_slurm
    (d / "hostnames").write_text("localhost\n")
    (d / "srun").write_text('#!/usr/bin/env bash\nwhile [ "${1#-}" != "$1" ]; do shift; done\n"$@"; exit 143\n')
    proc = subprocess.run(["bash", os.path.join(ROOT, "slurm", "pretrain.sbatch"), "bert-tiny", "--set",
                           "train.steps=0", f"out_dir={tmp_path / 'run'}"], capture_output=True, text=True,
                          env={**env, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "localhost",
                               "SLURM_TASKS_PER_NODE": "1"},
                          timeout=300)
    assert proc.returncode == 2 and "pretrain: error: train.steps=0 must be positive" in proc.stderr, proc.stderr


@pytest.mark.parametrize("script, args, says", [
    ("pretrain.sbatch", ["bert-tiny"], "ptm: error: SLURM_JOB_ID is not set: submit slurm/pretrain.sbatch with sbatch"),
    ("pretrain.sbatch", [], "usage: sbatch [--nodes N --ntasks-per-node G ...] slurm/pretrain.sbatch CONFIG"),
    ("prep.sbatch", [], "usage: sbatch --array=0-N slurm/prep.sbatch OUT INPUT... --tokenizer TOK"),
    ("convert.sbatch", [], "usage: sbatch slurm/convert.sbatch RUN_DIR [HF_OUT]")])
def test_slurm_scripts_run_wrongly_say_how_to_run_them(tmp_path, script, args, says):
    """Outside Slurm or without their arguments, one line naming the script (not Slurm's spool copy, which $0 is
    under sbatch: run here from such a copy), exit 2."""
    copy = tmp_path / "slurm_script"
    shutil.copy(os.path.join(ROOT, "slurm", script), copy)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(["bash", str(copy), *args], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith(says) and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("launcher", ["srun", "deepspeed"])
def test_under_srun_the_master_is_the_first_node_not_an_inherited_master_addr(fake_slurm, launcher):
    """sbatch exports the submitting shell's MASTER_ADDR and MASTER_PORT (say, from a torchrun run on a workstation)
    to the job: under srun, and the deepspeed launcher's slurm backend (whose srun --export=ALL passes no master), the
    tasks are told the allocation's first node and the job's port (20000 + job id), as under mpirun (two jobs on a
    node would share a port inherited). The tasks get the job's CPUs per task (srun takes none from sbatch since
    Slurm 22.05: SRUN_CPUS_PER_TASK)."""
    env, d = fake_slurm
    (d / "hostnames").write_text("localhost\n127.0.0.1\n")
    proc = subprocess.run(["bash", os.path.join(ROOT, "slurm", "pretrain.sbatch"), "bert-tiny"], capture_output=True,
                          text=True, env={**env, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]",
                                          "SLURM_TASKS_PER_NODE": "2(x2)", "MASTER_ADDR": "10.9.9.9",
                                          "MASTER_PORT": "29500", "PTM_LAUNCHER": launcher,
                                          "SLURM_CPUS_PER_TASK": "6"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [c for c in (d / "calls.log").read_text().splitlines() if c.startswith("srun")][-1].endswith(
        "(MASTER_ADDR=localhost MASTER_PORT=20007 SRUN_CPUS_PER_TASK=6)")
