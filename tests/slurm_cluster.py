"""A real Slurm controller and compute node on loopback, for tests (Debian's slurmctld/slurmd, run as root).

`SlurmCluster(tmpdir).start()` writes a slurm.conf, starts both daemons and waits for the node to be
idle; `.env` carries SLURM_CONF for sbatch/squeue; `.stop()` cancels jobs and stops the daemons.
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
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
KillWait=5
InactiveLimit=0
MinJobAge=300
NodeName={host} NodeAddr=127.0.0.1 CPUs=8 RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=60 State=UP
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    def __init__(self, directory: str):
        self.dir = directory
        self.conf = os.path.join(directory, "slurm.conf")
        self.env = {**os.environ, "SLURM_CONF": self.conf}

    @staticmethod
    def available() -> bool:
        return all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch", "sinfo")) and os.geteuid() == 0

    def start(self, timeout: float = 60) -> "SlurmCluster":
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        with open(self.conf, "w") as f:
            f.write(CONF.format(host=socket.gethostname().split(".")[0], d=self.dir, ctld_port=_free_port(),
                                d_port=_free_port()))
        subprocess.run(["slurmctld", "-f", self.conf, "-i"], check=True, env=self.env)
        subprocess.run(["slurmd", "-f", self.conf], check=True, env=self.env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=self.env)
            if out.stdout.strip() == "idle":
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"Slurm node not idle after {timeout}s; see {self.dir}/slurmctld.log and slurmd.log")

    def sbatch(self, *args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(["sbatch", *args], capture_output=True, text=True, env=self.env, cwd=cwd)

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "-u", "root"], capture_output=True, env=self.env)
        for name in ("slurmd.pid", "slurmctld.pid"):
            try:
                with open(os.path.join(self.dir, name)) as f:
                    os.kill(int(f.read().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
