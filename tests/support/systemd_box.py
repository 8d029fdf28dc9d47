"""A server host with a real systemd: the distribution's systemd booted in its own namespaces
(support.real_systemd), a real sshd running as one of its units, and production: a vLLM stand-in
(support.standin_vllm: the GPU is an exclusive lock) under a realistic unit (User=, Environment= with
a secret holding `$`, both quotes, a backslash and spaces, EnvironmentFile=, WorkingDirectory=,
Restart=always, limits, a worker process, seconds to stop).

`systemd_host`: the booted systemd and its sshd (one per test module: the tier is one module).
`real_box`: production's unit written and loaded for one test, torn down after it (every unit the test
left stopped, the unit file removed, systemd reloaded).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import real_systemd
from support.requirements import SSHD, require, unavailable
from support.sshd import SshServer, prepare_sshd, wait_listening

from eagle3_pipeline.ports import free_port

UNIT = "vllm.service"
SECRET = "hf_s3cr$t'q\"d \\x b"  # as the server must see it, byte for byte
SECRET_IN_UNIT = "hf_s3cr$t'q\\\"d \\\\x b"  # the same inside a double-quoted Environment= entry
PROGRAM = Path(__file__).with_name("standin_vllm.py")
REPO = Path(__file__).resolve().parents[2]


@dataclass
class SystemdHost:
    """The booted systemd and the sshd inside it."""

    systemd: real_systemd.BootedSystemd
    sshd: SshServer


def start_systemd_host(sshd_root: Path, release: Path | None = None) -> SystemdHost:
    """Boot systemd (its folder under /var/tmp: units run as other users read programs there; the
    distribution's, or a newer one unpacked at `release`) and start an sshd as one of its units, its
    keys and config under `sshd_root`."""
    root = Path(tempfile.mkdtemp(prefix="eagle3-systemd-", dir="/var/tmp"))
    booted = real_systemd.boot(root, release)
    try:
        sshd, config = prepare_sshd(sshd_root)
        booted.run("systemd-run", "--unit=eagle3-test-sshd", "--", SSHD, "-D", "-e", "-f", str(config))

        def alive() -> str | None:
            state = booted.show("eagle3-test-sshd.service", "ActiveState")["ActiveState"]
            journal = booted.run("journalctl", "--no-pager", "-u", "eagle3-test-sshd", check=False).stdout
            up = state in ("active", "activating")
            return None if up else f"sshd in systemd is {state}: {journal[-2000:]}"

        wait_listening(sshd.port, alive)
    except BaseException:
        stop_systemd_host(booted)
        raise
    return SystemdHost(booted, sshd)


def stop_systemd_host(booted: real_systemd.BootedSystemd) -> None:
    real_systemd.halt(booted.cgroup)
    shutil.rmtree(booted.root, ignore_errors=True)


@pytest.fixture(scope="module")
def systemd_host(tmp_path_factory: pytest.TempPathFactory):
    """The distribution's systemd (252 on Debian 12) and an sshd in it, for one test module."""
    require("systemd")
    require("ssh")
    host = start_systemd_host(tmp_path_factory.mktemp("systemd-sshd"))
    yield host
    stop_systemd_host(host.systemd)


@pytest.fixture(scope="module")
def newer_systemd_host(tmp_path_factory: pytest.TempPathFactory):
    """Debian bookworm-backports' systemd 254 (real_systemd.fetch_release, cached under .cache/systemd)
    and an sshd in it; a test module that names this fixture `systemd_host` runs its tests on 254."""
    require("systemd")
    require("ssh")
    try:
        release = real_systemd.fetch_release("254", REPO / ".cache" / "systemd")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:  # no Debian archive here
        unavailable("systemd", f"cannot fetch systemd 254 from Debian's archive: {err}")
    host = start_systemd_host(tmp_path_factory.mktemp("systemd-sshd"), release)
    yield host
    stop_systemd_host(host.systemd)


class RealBox:
    """Production on the booted systemd, and what a test reads of it."""

    def __init__(self, host: SystemdHost, root: Path) -> None:
        self.systemd, self.root, self.port = host.systemd, root, free_port()
        self.events_file, self.records = root / "events.jsonl", root / "run-eagle3"
        self.lock, self.env_file = root / "gpu.lock", root / "vllm.env"

    @property
    def record(self) -> Path:
        return self.records / f"{UNIT}.serve-check.json"

    def unit_text(self, extra: str = "", user: str | None = "nobody") -> str:
        return (
            "[Unit]\nDescription=vLLM (test stand-in: its GPU is an exclusive lock)\n"
            f"After=network-online.target\n[Service]\n{f'User={user}' if user else ''}\n"
            f'Environment="HF_TOKEN={SECRET_IN_UNIT}" VLLM_LOGGING_LEVEL=INFO\n'
            f"EnvironmentFile={self.env_file}\nWorkingDirectory={self.root}\n"
            f"ExecStart={self.root}/bin/vllm serve /models/kimi --port {self.port} "
            "--served-model-name kimi-k2\n"
            f"Restart=always\nRestartSec=1\nLimitNOFILE=65536\nTimeoutStopSec=30\n{extra}"
        )

    def install(self, extra: str = "", user: str | None = "nobody") -> None:
        """Write production's unit (with `extra` [Service] lines) and load it."""
        (self.systemd.units / UNIT).write_text(self.unit_text(extra, user))
        self.systemd.systemctl("daemon-reload")

    def set(self, name: str) -> None:
        (self.root / name).write_text("")

    def events(self) -> list[dict]:
        if not self.events_file.exists():
            return []
        return [json.loads(line) for line in self.events_file.read_text().splitlines()]

    def starts(self, draft: bool = False) -> list[dict]:
        return [e for e in self.events() if e["event"] == "start" and e["draft"] == draft]

    def gpu_refusals(self) -> list[dict]:
        """Servers that found the GPU held by another: never, when the check orders its starts."""
        return [e for e in self.events() if e["event"] == "gpu-busy"]

    def state(self, unit: str = UNIT) -> dict[str, str]:
        return self.systemd.show(unit, "ActiveState", "MainPID", "InvocationID", "LoadState")

    def cmdline(self, unit: str = UNIT) -> str:
        """What the unit's main process runs, read inside systemd's namespaces (its own /proc)."""
        pid = self.state(unit)["MainPID"]
        return self.systemd.run("cat", f"/proc/{pid}/cmdline").stdout.replace("\0", " ")

    def check_units(self) -> list[str]:
        out = self.systemd.systemctl(
            "list-units", "--all", "--plain", "--no-legend", "eagle3-serve-check-*"
        ).stdout
        return [line.split()[0] for line in out.splitlines() if line.strip()]

    def wait_production(self, timeout: float = 60) -> None:
        self.systemd.wait_for(self.serving, timeout, "production serving")

    def serving(self) -> bool:
        """Production active, answering /health (its own stand-in, not the draft)."""
        import requests

        if self.state()["ActiveState"] != "active":
            return False
        try:
            return requests.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def production_check(self):
        """The serve check's production verification: production's server healthy and serving kimi-k2."""
        from eagle3_pipeline.server.health import check_model, wait_healthy

        def check() -> None:
            wait_healthy(f"http://127.0.0.1:{self.port}", 30)
            check_model(f"http://127.0.0.1:{self.port}", "kimi-k2")

        return check

    def gpu_held_by_one_server_at_a_time(self) -> None:
        """No server was refused the GPU, and every draft started after production's last exit before
        it, and production after the draft's exit (worker included: the lock is the proof)."""
        assert self.gpu_refusals() == [], self.gpu_refusals()

    def clean_up(self) -> None:
        for unit in [*self.check_units(), UNIT]:
            self.systemd.systemctl("stop", unit, check=False)
        self.systemd.systemctl("reset-failed", check=False)
        (self.systemd.units / UNIT).unlink(missing_ok=True)
        self.systemd.systemctl("daemon-reload")


def make_box(host: SystemdHost) -> RealBox:
    """Production's files in a folder of its own under the booted systemd's, its unit loaded."""
    root = Path(tempfile.mkdtemp(prefix="standin-vllm-", dir=host.systemd.root))  # support.costs skips it
    root.chmod(0o777)  # the events file and the lock are written by User=nobody
    box = RealBox(host, root)
    (root / "bin").mkdir()
    (root / "bin" / "vllm").write_text("#!/usr/bin/python3\n" + PROGRAM.read_text())  # as `vllm serve`
    (root / "bin" / "vllm").chmod(0o755)
    for path in (box.events_file, box.lock):
        path.write_text("")
        path.chmod(0o666)
    box.env_file.write_text(f"EAGLE3_TEST_GPU={box.lock}\nEAGLE3_TEST_EVENTS={box.events_file}\n")
    box.records.mkdir()
    box.install()
    return box


@pytest.fixture
def real_box(systemd_host: SystemdHost):
    box = make_box(systemd_host)
    yield box
    box.clean_up()
    shutil.rmtree(box.root, ignore_errors=True)


def wait(predicate, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached in {timeout} s")
        time.sleep(0.1)
