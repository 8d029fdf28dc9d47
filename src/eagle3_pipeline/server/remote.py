"""Running commands and reading files on the server host: locally through invoke, remotely through
fabric with strict known_hosts checking, connect/command timeouts, keepalive and no stdin.

Fabric alone trusts any host key (AutoAddPolicy) and loads no known_hosts: here the client's policy
refuses unknown keys unless `server.ssh.known_hosts` is `accept_new`, and only the configured
known_hosts file is consulted.
"""

from __future__ import annotations

import logging
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import invoke
import paramiko
from fabric import Config, Connection

log = logging.getLogger(__name__)


class HostError(RuntimeError):
    """The host could not be reached or a command on it failed; the message says what to do."""


@dataclass
class Result:
    """A finished command: exit status and its output."""

    exited: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exited == 0


class LocalHost:
    """This machine (`server.host: local`)."""

    name = "local"
    is_local = True

    def run(self, command: str, timeout: float | None = 60) -> Result:
        try:
            res = invoke.run(command, hide=True, warn=True, in_stream=False, timeout=timeout)
        except invoke.CommandTimedOut as err:
            raise HostError(f"local command timed out after {timeout} s: {command}") from err
        return Result(res.exited, res.stdout, res.stderr)

    def read_file(self, path: str) -> str:
        return Path(path).read_text()

    def hostname(self) -> str:
        return "127.0.0.1"

    def close(self) -> None:
        pass


class _RefuseUnknown(paramiko.MissingHostKeyPolicy):
    """Refuse an unknown host key with a message that says how to trust it."""

    def __init__(self, known_hosts_file: str) -> None:
        self.known_hosts_file = known_hosts_file

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        host, _, port = hostname.strip("[").partition("]:")
        scan = f"ssh-keyscan {'-p ' + port + ' ' if port else ''}{host} >> {self.known_hosts_file}"
        raise HostError(
            f"host key of {hostname} ({key.get_name()} {key.fingerprint}) is not in {self.known_hosts_file}; "
            f"the connection was refused (server.ssh.known_hosts: strict). To trust it, check that "
            f"fingerprint with the host's administrator, then run `{scan}`, or set "
            "server.ssh.known_hosts: accept_new to record it on first use"
        )


def _known_hosts_path(ssh_cfg: dict[str, Any]) -> str:
    return os.path.expanduser(ssh_cfg.get("known_hosts_file") or "~/.ssh/known_hosts")


class RemoteHost:
    """An SSH destination: an ~/.ssh/config alias or user@host[:port]."""

    is_local = False

    def __init__(self, destination: str, ssh_cfg: dict[str, Any], ssh_config_path: str | None = None) -> None:
        self.name = destination
        self.ssh_cfg = ssh_cfg
        self.connect_timeout = float(ssh_cfg.get("connect_timeout_s", 10))
        self.command_timeout = float(ssh_cfg.get("command_timeout_s", 60))
        config = Config(runtime_ssh_path=ssh_config_path) if ssh_config_path else Config()
        self.connection = Connection(
            destination,
            config=config,
            connect_timeout=self.connect_timeout,
            connect_kwargs={"banner_timeout": self.connect_timeout, "auth_timeout": self.connect_timeout},
        )
        self.connection.client = self._client(ssh_cfg)

    def _client(self, ssh_cfg: dict[str, Any]) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        path = _known_hosts_path(ssh_cfg)
        if ssh_cfg.get("known_hosts", "strict") == "accept_new":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).touch(exist_ok=True)
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        else:
            client.set_missing_host_key_policy(_RefuseUnknown(path))
        if os.path.exists(path):
            client.load_host_keys(path)
        return client

    def hostname(self) -> str:
        return self.connection.host

    def open(self) -> None:
        """Connect and authenticate within connect_timeout_s, or raise HostError saying why."""
        if self.connection.is_connected:
            return
        where = f"{self.connection.user}@{self.connection.host}:{self.connection.port}"
        try:
            self.connection.open()
        except HostError:
            raise
        except paramiko.BadHostKeyException as err:
            raise HostError(
                f"host key of {where} does not match {_known_hosts_path(self.ssh_cfg)}: the key changed or "
                "someone is in the middle; if the change is expected, remove the old line "
                f"(`ssh-keygen -R {err.hostname}`) and trust the new key"
            ) from None
        except paramiko.AuthenticationException as err:
            raise HostError(
                f"SSH authentication to {where} failed ({err}); check the user and the key "
                "(IdentityFile in ~/.ssh/config, or an agent)"
            ) from None
        except TimeoutError as err:
            raise HostError(f"SSH to {where}: no answer within {self.connect_timeout:g} s ({err})") from None
        except (paramiko.SSHException, OSError, EOFError) as err:
            raise HostError(f"SSH to {where} failed within {self.connect_timeout:g} s: {err}") from None
        keepalive = int(self.ssh_cfg.get("keepalive_s", 15))
        if keepalive and self.connection.transport is not None:
            self.connection.transport.set_keepalive(keepalive)

    def run(self, command: str, timeout: float | None = None) -> Result:
        self.open()
        timeout = timeout or self.command_timeout
        try:
            res = self.connection.run(command, hide=True, warn=True, in_stream=False, timeout=timeout)
        except invoke.CommandTimedOut as err:
            raise HostError(f"command on {self.name} timed out after {timeout:g} s: {command}") from err
        return Result(res.exited, res.stdout, res.stderr)

    def read_file(self, path: str) -> str:
        res = self.run(f"cat -- {shlex.quote(path)}")
        if res.ok:
            return res.stdout
        if "No such file" in res.stderr:
            raise FileNotFoundError(f"{self.name}:{path} does not exist")
        raise OSError(f"cannot read {self.name}:{path}: {res.stderr.strip()}")

    def close(self) -> None:
        self.connection.close()


def open_host(server_cfg: dict[str, Any], ssh_config_path: str | None = None) -> LocalHost | RemoteHost:
    """The host named by `server.host`."""
    if server_cfg.get("host", "local") == "local":
        return LocalHost()
    return RemoteHost(server_cfg["host"], server_cfg.get("ssh", {}), ssh_config_path)
