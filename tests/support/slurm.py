"""A real one-node SLURM cluster on 127.0.0.1 for the SLURM tier (tests/slurm/): Debian's slurmctld,
slurmd and munge (22.05; `.ci/run` installs them), started from a scratch folder and stopped again.

The node is declared at the size of an 8-GPU H100/H200 node (112 CPUs, 1.2 TB, 8 GPUs: room for the
Kimi example's engine allocation, 68 CPUs and 1,026,260 MiB) on a 2-core machine:
`SlurmdParameters=config_overrides` has slurmd take the declared size. The 8 GPUs are count-only gres
(22.05 needs a `File=` per GPU: links to /dev/null); no cgroups (`proctrack/linuxproc`, `task/none`);
no accounting (the plugin tracks jobs with squeue, `MinJobAge` keeps finished jobs listed long enough
for it). Partitions `cpu` and `gpu`, the profile's.
Client commands find the cluster through `SLURM_CONF` (`env`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.requirements import require, unavailable

NODE = "node1"
NODE_SIZE = "CPUs=112 Boards=1 SocketsPerBoard=2 CoresPerSocket=56 ThreadsPerCore=1 RealMemory=1200000"
START_TIMEOUT_S = 60.0
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def slurm_conf(root: Path, ctld_port: int, slurmd_port: int, munge_socket: Path) -> str:
    """The cluster's slurm.conf (root: the scratch folder of its state, spool and logs)."""
    return f"""\
ClusterName=eagle3test
SlurmctldHost={socket.gethostname()}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
KillWait=5
SchedulerParameters=sched_interval=1
MpiDefault=none
NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname={socket.gethostname()} {NODE_SIZE} Gres=gpu:8 State=UNKNOWN
PartitionName=cpu Nodes={NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
PartitionName=gpu Nodes={NODE} MaxTime=INFINITE State=UP OverSubscribe=NO
"""


@dataclass
class Cluster:
    """A running one-node cluster: its config folder and the environment its clients need."""

    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *command: str) -> str:
        """A SLURM client command against this cluster; its stdout."""
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=60, check=True)
        return done.stdout

    def jobs(self) -> list[dict[str, str]]:
        """Every job slurmctld still lists (finished ones for MinJobAge): id, name, state, nodes, gres."""
        out = self.run("squeue", "--all", "--states=all", "--noheader", "--format=%i|%j|%T|%D|%b|%C|%m")
        keys = ("id", "name", "state", "nodes", "tres", "cpus", "mem")
        return [dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines() if line.strip()]

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log")))


def _start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    sink = open(log, "ab")  # noqa: SIM115 - the daemon's, closed when it is stopped
    return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _wait_node_idle(cluster: Cluster, daemons: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if any(d.poll() is not None for d in daemons):
            raise RuntimeError(f"a SLURM daemon exited at start:\n{cluster.logs()}")
        try:
            state = cluster.run("sinfo", "--noheader", "--nodes", NODE, "--format=%T").split()
        except subprocess.CalledProcessError:
            state = []
        if state and all(s == "idle" for s in state):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the SLURM node never became idle:\n{cluster.logs()}")


def _stop(daemons: list[subprocess.Popen]) -> None:
    for daemon in reversed(daemons):
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGTERM)
    for daemon in reversed(daemons):
        try:
            daemon.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()


@contextmanager
def one_node_cluster(root: Path) -> Iterator[Cluster]:
    """Start munged, slurmctld and slurmd in `root`; stop every one of them afterwards."""
    require("slurm")  # a skip on a developer's machine without the packages; a failure under CI=true
    root.mkdir(parents=True, exist_ok=True)
    for folder in ("state", "spool", "gpus", "munge"):
        (root / folder).mkdir(exist_ok=True)
    for i in range(8):
        (root / "gpus" / f"gpu{i}").symlink_to("/dev/null")
    munge_socket = root / "munge" / "munge.socket"
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    cluster = Cluster(root)
    cluster.conf.write_text(slurm_conf(root, _free_port(), _free_port(), munge_socket))
    (root / "gres.conf").write_text(f"NodeName={NODE} Name=gpu File={root}/gpus/gpu[0-7]\n")
    # the plugin's job step (snakemake-executor-plugin-slurm-jobstep 0.6.1) drops SLURM_CONF before its
    # srun: the nested srun finds the cluster only where a site keeps it, /etc/slurm (never a real one's)
    if SYSTEM_CONF.exists():
        unavailable("slurm", f"{SYSTEM_CONF} exists: this machine belongs to a real cluster")
    SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
    for name in ("slurm.conf", "gres.conf"):
        (SYSTEM_CONF.parent / name).symlink_to(root / name)
    env = cluster.env
    daemons = [
        _start(
            ["/usr/sbin/munged", "--foreground", "--force", f"--socket={munge_socket}", f"--key-file={key}",
             f"--pid-file={root}/munge/munged.pid", f"--log-file={root}/munged.log",
             f"--seed-file={root}/munge/seed"],
            root / "munged.out", env,
        ),
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not munge_socket.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        daemons.append(
            _start(["slurmctld", "-D", "-i", "-f", str(cluster.conf)], root / "slurmctld.out", env)
        )
        daemons.append(
            _start(["slurmd", "-D", "-N", NODE, "-f", str(cluster.conf)], root / "slurmd.out", env)
        )
        _wait_node_idle(cluster, daemons)
        yield cluster
    finally:
        _cancel_all(cluster)
        _stop(daemons)
        for name in ("slurm.conf", "gres.conf"):
            (SYSTEM_CONF.parent / name).unlink(missing_ok=True)


def _cancel_all(cluster: Cluster) -> None:
    """No job of the tier outlives it."""
    with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired, FileNotFoundError):
        cluster.run("scancel", "--full", "--user", "root")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The session's one-node cluster (started in about a second), every daemon stopped at the end."""
    with one_node_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
