"""The systemd stand-in (tests/data/remote/systemctl-unit) installed on the test sshd's remote PATH as
`systemctl`, `systemd-run` and `journalctl`, with `sudo` (tests/data/remote/sudo), and what a test
reads of it: production's starts, its command line, the unit files' bytes, the check units made.

The production unit's process is a small HTTP server answering /health and /v1/models; the words
systemd would pass are its arguments, so /proc/MAINPID/cmdline shows what "runs". Started with
`--speculative-config` while @STATE@/draft-crashes exists, it exits 1 at once (a crashing draft);
without it, the same with @STATE@/production-crashes.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from support.sshd import StandInUnit, kill_stand_in_unit

from eagle3_pipeline.ports import free_port

DATA = Path(__file__).resolve().parents[1] / "data"
UNIT = "vllm.service"
PRODUCTION = "/usr/bin/vllm serve /models/kimi --port 8000 --served-model-name kimi-k2"
SERVER = (
    "import functools, http.server, os, sys\n"
    "port, folder, state = int(sys.argv[1]), sys.argv[2], sys.argv[3]\n"
    "draft = '--speculative-config' in sys.argv\n"
    "if os.path.exists(state + ('/draft-crashes' if draft else '/production-crashes')):\n"
    "    sys.exit('CUDA error (scripted crash)')\n"
    "handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=folder)\n"
    "http.server.ThreadingHTTPServer(('127.0.0.1', port), handler).serve_forever()\n"
)
NAMES = ("systemctl", "systemd-run", "journalctl", "sudo")


class Box(StandInUnit):
    """The stand-in's state, production's unit folder and the record folder on the "host"."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port = root, port
        self.state, self.units, self.records = root / "state", root / "units", root / "run-eagle3"

    @property
    def record(self) -> Path:
        return self.records / f"{UNIT}.serve-check.json"

    def set(self, name: str, value: str = "") -> None:
        (self.state / name).write_text(value)

    def acts(self) -> list[str]:
        """Calls that change something (reads left out)."""
        reads = ("systemctl show", "systemctl is-", "systemctl cat", "journalctl")
        return [c for c in self.calls() if not c.startswith(reads)]

    def starts(self) -> list[str]:
        """production's InvocationIDs, one per start."""
        path = self.state / "starts"
        return path.read_text().split() if path.exists() else []

    def invocation(self) -> str:
        return (self.state / "invocation").read_text().strip()

    def cmdline(self, state: Path | None = None) -> str:
        pid = ((state or self.state) / "mainpid").read_text().strip()
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")

    def unit_files(self) -> dict[str, bytes]:
        """Every file under production's unit folder, byte for byte."""
        return {str(p): p.read_bytes() for p in sorted(self.units.rglob("*")) if p.is_file()}

    def check_units(self) -> list[Path]:
        """The check units systemd-run made (running, then collected)."""
        return sorted([*self.state.glob("transient/*"), *self.state.glob("collected/*")])

    def props(self, check: Path) -> list[str]:
        return (check / "props").read_text().splitlines()


@pytest.fixture
def box(sshd_server, tmp_path: Path):
    fake = Box(tmp_path, free_port())
    served = tmp_path / "served"
    for folder in (fake.state, fake.units, fake.records, served / "v1"):
        folder.mkdir(parents=True)
    (served / "health").write_text("")
    (served / "v1" / "models").write_text(json.dumps({"data": [{"id": "kimi-k2"}]}))
    server = shlex.quote(SERVER)
    (fake.state / "exec").write_text(
        f'#!/bin/sh\nexec {sys.executable} -c {server} {fake.port} {served} {fake.state} "$@"\n'
    )
    (fake.state / "exec").chmod(0o755)
    fake.set("production-exec", PRODUCTION)
    fake.set("argv")
    (fake.units / UNIT).write_text(
        f"[Unit]\nDescription=vLLM\n[Service]\nUser=vllm\nExecStart={PRODUCTION}\n"
    )
    fake.set(
        "show-props",
        "User=vllm\nWorkingDirectory=/srv/vllm\nEnvironment=HF_HOME=/cache HF_TOKEN=hf_standinsecret\n"
        f"EnvironmentFiles={fake.root}/vllm*.env (ignore_errors=yes)\nLimitNOFILE=1048576\n"
        "LimitNOFILESoft=65536\nCPUAffinity=0-3\n",
    )
    script = (DATA / "remote" / "systemctl-unit").read_text()
    script = script.replace("@STATE@", str(fake.state)).replace("@UNITS@", str(fake.units))
    script = script.replace("@UNIT@", UNIT)
    sudo = (DATA / "remote" / "sudo").read_text().replace("@STATE@", str(fake.state))
    for name in NAMES:
        (sshd_server.bin_dir / name).write_text(sudo if name == "sudo" else script)
        (sshd_server.bin_dir / name).chmod(0o755)
    yield fake
    for check in fake.state.glob("transient/*"):
        kill_stand_in_unit(check)
    kill_stand_in_unit(fake.state)
    for name in NAMES:
        (sshd_server.bin_dir / name).unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The serve check's polls and reconnect back-off shortened (the stand-in answers at once)."""
    from eagle3_pipeline.server import host_record, remote

    monkeypatch.setattr(host_record, "POLL_S", 0.2)
    monkeypatch.setattr(remote, "TRANSPORT_BACKOFF_S", 0.1)


@pytest.fixture
def host(sshd_server):
    """The stand-in box over the real sshd, as the pipeline reaches a server host."""
    from eagle3_pipeline.server.remote import RemoteHost
    from eagle3_pipeline.settings import SshSettings, section

    remote_host = RemoteHost(
        "vllm-box", section(SshSettings, sshd_server.server_cfg()["ssh"]), str(sshd_server.ssh_config)
    )
    yield remote_host
    remote_host.close()
