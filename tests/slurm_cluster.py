"""A real Slurm cluster on loopback for tests: one controller and two simulated compute nodes n1, n2 (Debian's
slurmctld and one slurmd per node, each on its own port of 127.0.0.1, run as root).

`SlurmCluster(tmpdir).start()` writes a slurm.conf, starts the daemons and waits for the nodes to be idle;
`.env` carries SLURM_CONF for sbatch/squeue; `.stop()` cancels jobs and stops the daemons.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

CONF = """\
ClusterName=ptmtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
KillWait=5
InactiveLimit=0
MinJobAge=300
JobRequeue=1
{nodes}
PartitionName=debug Nodes={names} Default=YES MaxTime=60 State=UP
"""
NODE = "NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=8 RealMemory=8000 State=UNKNOWN"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    def __init__(self, directory: str, nodes: int = 2):
        self.dir, self.nodes = directory, [f"n{i + 1}" for i in range(nodes)]
        self.conf = os.path.join(directory, "slurm.conf")
        # jobs size their threads from their allocation (slurm/pretrain.sbatch), not from the tests' setting
        self.env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {"SLURM_CONF": self.conf}

    @staticmethod
    def available() -> bool:
        return all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch", "sinfo")) and os.geteuid() == 0

    def start(self, timeout: float = 60) -> "SlurmCluster":
        os.makedirs(os.path.join(self.dir, "state"), exist_ok=True)
        host = socket.gethostname().split(".")[0]
        for name in self.nodes:
            os.makedirs(os.path.join(self.dir, f"spool-{name}"), exist_ok=True)
        nodes = "\n".join(NODE.format(name=n, host=host, port=_free_port()) for n in self.nodes)
        with open(self.conf, "w") as f:
            f.write(CONF.format(host=host, d=self.dir, ctld_port=_free_port(), d_port=_free_port(), nodes=nodes,
                                names=",".join(self.nodes)))
        subprocess.run(["slurmctld", "-f", self.conf, "-i"], check=True, env=self.env)
        for name in self.nodes:
            subprocess.run(["slurmd", "-f", self.conf, "-N", name], check=True, env=self.env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, env=self.env)
            if out.stdout.split() == ["idle"] * len(self.nodes):
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"Slurm nodes not idle after {timeout}s; see {self.dir}/slurmctld.log and slurmd-*.log")

    def sbatch(self, *args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(["sbatch", *args], capture_output=True, text=True, env=self.env, cwd=cwd)

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "-u", "root"], capture_output=True, env=self.env)
        for name in [f"slurmd-{n}.pid" for n in self.nodes] + ["slurmctld.pid"]:
            try:
                with open(os.path.join(self.dir, name)) as f:
                    os.kill(int(f.read().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
