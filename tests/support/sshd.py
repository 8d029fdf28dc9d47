"""A real OpenSSH server on 127.0.0.1 for the SSH tests (Debian package openssh-server).

`sshd_server` starts /usr/sbin/sshd on a free port with a generated host key, a generated user key,
its own authorized_keys and config (no PAM, StrictModes no), and gives the tests an ~/.ssh/config-style
file with the alias `vllm-box`, a known_hosts file that trusts the host key, and `bin_dir`, a folder put
first on the remote PATH (through authorized_keys `environment=`) for test data such as a stand-in
systemctl. Tests skip with the reason when sshd or ssh-keygen is missing or we are not root.
"""

from __future__ import annotations

import getpass
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.requirements import SSHD, require

from eagle3_pipeline.ports import free_port

ALIAS = "vllm-box"


def keygen(path: Path) -> str:
    """Generate an ed25519 key pair at path; return the public key line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return Path(f"{path}.pub").read_text().strip()


@dataclass
class SshServer:
    """A running sshd and what a client needs to reach it."""

    port: int
    user: str
    root: Path
    host_public_key: str
    user_key: Path
    ssh_config: Path
    known_hosts: Path
    bin_dir: Path

    def server_cfg(self, **overrides: object) -> dict:
        ssh = {
            "known_hosts": "strict",
            "known_hosts_file": str(self.known_hosts),
            "connect_timeout_s": 5,
            "command_timeout_s": 20,
            "keepalive_s": 5,
            "sudo": False,
        }
        ssh.update(overrides.pop("ssh", {}))  # type: ignore[arg-type]
        cfg = {"host": ALIAS, "unit": "vllm.service", "unit_file": None, "manage": False, "ssh": ssh}
        cfg.update(overrides)
        return cfg

    def write_ssh_config(self, path: Path, identity: Path) -> Path:
        path.write_text(
            f"Host {ALIAS}\n  HostName 127.0.0.1\n  Port {self.port}\n  User {self.user}\n"
            f"  IdentityFile {identity}\n  IdentitiesOnly yes\n"
        )
        return path


def prepare_sshd(root: Path) -> tuple[SshServer, Path]:
    """Keys, authorized_keys (the remote PATH starting with `bin_dir`), sshd_config on a free port and
    the client's files, under `root`: the server as a test reaches it, and its sshd_config."""
    host_key, user_key = root / "host_ed25519", root / "user_ed25519"
    keygen(host_key)
    user_public = keygen(user_key)
    bin_dir = root / "remote-bin"
    bin_dir.mkdir()
    env_path = f"{bin_dir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    (root / "authorized_keys").write_text(f'environment="PATH={env_path}" {user_public}\n')
    port = free_port()
    config = root / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {root}/sshd.pid\n"
        f"AuthorizedKeysFile {root}/authorized_keys\nUsePAM no\nStrictModes no\nPubkeyAuthentication yes\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        "PermitUserEnvironment yes\nLogLevel VERBOSE\n"
    )
    host_public = Path(f"{host_key}.pub").read_text().split()
    known_hosts = root / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_public[0]} {host_public[1]}\n")
    server = SshServer(
        port=port,
        user=getpass.getuser(),
        root=root,
        host_public_key=" ".join(host_public[:2]),
        user_key=user_key,
        ssh_config=root / "ssh_config",
        known_hosts=known_hosts,
        bin_dir=bin_dir,
    )
    server.write_ssh_config(server.ssh_config, user_key)
    return server, config


def wait_listening(port: int, alive: Callable[[], str | None]) -> None:
    """Until something listens on 127.0.0.1:port; `alive` says why the server died, or None."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if (why := alive()) is not None:
            raise RuntimeError(why)
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"sshd did not listen on {port}")


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory: pytest.TempPathFactory):
    """A real sshd on 127.0.0.1 (session-wide); skipped with the reason when it cannot run here."""
    require("ssh")
    root = tmp_path_factory.mktemp("sshd")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    server, config = prepare_sshd(root)
    log = root / "sshd.log"
    with open(log, "wb") as log_handle:
        proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stdout=log_handle, stderr=subprocess.STDOUT
        )
    try:
        wait_listening(
            server.port,
            lambda: (
                None if proc.poll() is None else f"sshd exited ({proc.returncode}): {log.read_text()[-2000:]}"
            ),
        )
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def kill_stand_in_unit(state: Path) -> None:
    """Kill what the systemctl stand-in (tests/data/remote/systemctl-unit) started for a unit: its
    main process and that process's children (an `exec` script's HTTP server), which share the process
    group the stand-in's `setsid` made, so that no test leaves a server behind."""
    try:
        pid = int((state / "mainpid").read_text())
        group = os.getpgid(pid)
    except (OSError, ValueError):
        return  # never started, or already gone
    if group != os.getpgid(0):  # the stand-in's own session, never the test's
        os.killpg(group, signal.SIGKILL)


class StandInUnit:
    """What a test reads of the systemctl stand-in's state folder (`state`) and of the unit's server
    (`port`): the commands it was called with, whether its main process runs, production's health."""

    state: Path
    port: int

    def calls(self) -> list[str]:
        path = self.state / "calls"
        return path.read_text().splitlines() if path.exists() else []

    def mainpid_alive(self) -> bool:
        try:
            os.kill(int((self.state / "mainpid").read_text()), 0)
        except (OSError, ValueError):
            return False
        return True

    def production_check(self, served: str = "kimi-k2"):
        """The serve check's production verification: the unit's server healthy and serving `served`."""
        from eagle3_pipeline.server.health import check_model, wait_healthy

        def check() -> None:
            wait_healthy(f"http://127.0.0.1:{self.port}", 30)
            check_model(f"http://127.0.0.1:{self.port}", served)

        return check
