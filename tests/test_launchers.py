"""The rendezvous contract (launchers/): every launcher's variables become torch's; inconsistent environments are
one line naming the variable; `ptm launch env|hostfile|master` inside a real Slurm job; an unreachable master and a
stalled collective end the run after parallel.timeout_s, naming the rank and host."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import psutil
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


@pytest.mark.parametrize("env, expected", [
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "MASTER_ADDR"),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"},
     "OMPI_COMM_WORLD_LOCAL_SIZE=3 does not divide OMPI_COMM_WORLD_SIZE=4"),
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2",
      "SLURM_STEP_TASKS_PER_NODE": "3,1", "MASTER_ADDR": "n1"}, "every node needs the same number"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not a whole number"),
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


def test_a_stalled_rank_ends_the_job_after_the_timeout(train_data, tmp_path):
    """One of two ranks stops (SIGSTOP) mid-run: the other gives up at its next collective after parallel.timeout_s
    with one line naming itself, and torchrun ends the job, instead of both waiting until a time limit."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", f"--master_port={free_port()}",
           "-m", "pretrain", "train", "--config", "bert-tiny", "--set", f"data.path={train_data}", "data.num_workers=0",
           "data.seq_len=32", "model.max_position_embeddings=32", "train.global_batch_size=4",
           "train.micro_batch_size=2", "train.steps=100000", "train.eval_interval=0", "data.valid_fraction=0.02",
           "parallel.timeout_s=10", f"out_dir={tmp_path}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.2)
    workers = psutil.Process(proc.pid).children()
    rank1 = next(w for w in workers if w.environ().get("RANK") == "1")
    rank1.send_signal(signal.SIGSTOP)
    stalled = time.time()
    try:
        proc.wait(timeout=180)
    finally:
        if rank1.is_running():
            rank1.send_signal(signal.SIGKILL)
    stderr = proc.stderr.read()
    assert proc.returncode != 0 and time.time() - stalled < 120, stderr[-3000:]
    assert f"pretrain: error: rank 0 on {socket.gethostname()} lost contact" in stderr, stderr[-3000:]
