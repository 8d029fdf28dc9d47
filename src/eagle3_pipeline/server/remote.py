"""Running commands and reading files on the server host: locally through invoke, remotely through
fabric with strict known_hosts checking, connect/command timeouts, keepalive and no stdin.

Fabric alone trusts any host key (AutoAddPolicy) and loads no known_hosts: here the client's policy
refuses unknown keys unless `server.ssh.known_hosts` is `accept_new`, and only the configured
known_hosts file is consulted. `accept_new` behaves like OpenSSH's `StrictHostKeyChecking accept-new`:
the new key's line is APPENDED (hashed when the ssh config says `HashKnownHosts yes`) and every other
byte of the file is left as it was; paramiko's own AutoAddPolicy would rewrite the whole file from
what it understood, dropping comments and `@cert-authority`/`@revoked` lines. A key listed under
`@revoked` is refused in both modes (paramiko ignores those lines).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import invoke
import paramiko
from fabric import Config, Connection

from eagle3_pipeline.secrets import REDACTOR
from eagle3_pipeline.settings import ServerSettings, SshSettings

log = logging.getLogger(__name__)
T = TypeVar("T")
NO_EXIT_STATUS = -1  # paramiko's exit status of a channel that closed without one: the link dropped

C_LOCALE = "export LC_ALL=C; "  # prefixed to every remote command; sudo keeps LC_ALL (env_keep)
MISSING_EXIT = 66  # read_file's exit status for a path that does not exist


class HostError(RuntimeError):
    """The host could not be reached or a command on it failed; the message says what to do."""


class TransportError(HostError):
    """The SSH link failed (refused, dropped, half-dead: paramiko's `SSHException`, EOF, a socket
    error, a channel closed with no exit status) or the command outlived its timeout: whether the
    command ran on the host is UNKNOWN. The next call reconnects with a fresh connection; a caller
    re-reads the host's state before acting again (`retry_transport`)."""


TRANSPORT_ATTEMPTS = 4
TRANSPORT_BACKOFF_S = 1.0  # doubled after each failed try: 1, 2, 4 s


def retry_transport(action: Callable[[], T], what: str, attempts: int | None = None,
                    backoff_s: float | None = None) -> T:  # fmt: skip
    """`action()` again after a TransportError, with backoff, up to `attempts` tries. Only for an
    action that is safe to repeat: a read, or a step that reads the state first and acts only when
    the state says so (never a bare start or stop)."""
    attempts = attempts or TRANSPORT_ATTEMPTS
    delay = TRANSPORT_BACKOFF_S if backoff_s is None else backoff_s
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except TransportError as err:
            if attempt == attempts:
                raise
            log.warning("%s: %s (try %d/%d); reconnecting in %g s", what, err, attempt, attempts, delay)
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


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

    def run(self, command: str, timeout: float | None = 60, stdin: str | None = None) -> Result:
        in_stream = io.StringIO(stdin) if stdin is not None else False
        try:
            res = invoke.run(
                command, hide=True, warn=True, in_stream=in_stream, timeout=timeout, env={"LC_ALL": "C"}
            )
        except invoke.CommandTimedOut as err:
            raise TransportError(f"local command timed out after {timeout} s: {command}") from err
        return Result(res.exited, res.stdout, res.stderr)

    def read_file(self, path: str) -> str:
        return Path(path).read_text()

    def hostname(self) -> str:
        return "127.0.0.1"

    def another(self) -> LocalHost:
        """A second handle for another thread (the serve check's lease renewals)."""
        return LocalHost()

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


class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """Trust an unknown host key on first use by appending ONE line to known_hosts (OpenSSH's
    accept-new); the rest of the file is never rewritten."""

    def __init__(self, known_hosts_file: str, hashed: bool) -> None:
        self.known_hosts_file, self.hashed = known_hosts_file, hashed

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        _refuse_revoked(self.known_hosts_file, hostname, key)
        append_known_host(self.known_hosts_file, hostname, key, self.hashed)
        client.get_host_keys().add(hostname, key.get_name(), key)  # known for the rest of this session
        log.warning(
            "accepted the new host key of %s (%s %s) and appended it to %s",
            hostname, key.get_name(), key.fingerprint, self.known_hosts_file,
        )  # fmt: skip


def append_known_host(path: str, hostname: str, key: paramiko.PKey, hashed: bool = False) -> str:
    """Append `HOST KEYTYPE BASE64` to the known_hosts file at path (created 0600 when missing) and
    return the line; HOST is `[host]:port` off port 22, as paramiko and OpenSSH write it, and hashed
    (`|1|salt|hmac`) when asked. A missing final newline is added first so that the last line is kept."""
    entry = paramiko.HostKeys.hash_host(hostname) if hashed else hostname
    line = f"{entry} {key.get_name()} {key.get_base64()}\n"
    Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with open(fd, "ab") as handle:
        if handle.tell() > 0:
            with open(path, "rb") as reader:
                reader.seek(-1, io.SEEK_END)
                if reader.read(1) != b"\n":
                    handle.write(b"\n")
        handle.write(line.encode())
    return line


def load_known_hosts(keys: paramiko.HostKeys, path: str) -> None:
    """Add the plain and hashed host lines of a known_hosts file to keys. Marker lines
    (`@cert-authority`, `@revoked`) and lines paramiko cannot read are skipped: paramiko's own loader
    raises on the first of them."""
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", "@")):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
        except (paramiko.hostkeys.InvalidHostKey, paramiko.SSHException, ValueError):
            entry = None
        if entry is None or entry.key is None:
            log.info("%s:%d: skipped a line paramiko cannot read", path, number)
            continue
        for name in entry.hostnames:
            keys.add(name, entry.key.get_name(), entry.key)


def revoked_keys(path: str) -> set[tuple[str, str]]:
    """(key type, base64) of every `@revoked` line in a known_hosts file (empty when it is missing)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return set()
    keys = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0] == "@revoked":
            keys.add((fields[2], fields[3]))
    return keys


def _refuse_revoked(path: str, hostname: str, key: paramiko.PKey) -> None:
    if (key.get_name(), key.get_base64()) in revoked_keys(path):
        raise HostError(
            f"host key of {hostname} ({key.get_name()} {key.fingerprint}) is marked @revoked in {path}: "
            "the connection was refused"
        )


def _known_hosts_path(ssh: SshSettings) -> str:
    return os.path.expanduser(ssh.known_hosts_file)


class RemoteHost:
    """An SSH destination: an ~/.ssh/config alias or user@host[:port]."""

    is_local = False

    def __init__(self, destination: str, ssh: SshSettings, ssh_config_path: str | None = None) -> None:
        self.name = destination
        self.ssh = ssh
        self.connect_timeout = float(ssh.connect_timeout_s)
        self.command_timeout = float(ssh.command_timeout_s)
        self.ssh_config_path = ssh_config_path
        self.connection = self._connection()

    def _connection(self) -> Connection:
        """A fresh fabric Connection (and paramiko client) with our host-key policy on every hop."""
        path = self.ssh_config_path
        config = Config(runtime_ssh_path=path) if path else Config()
        connection = Connection(
            self.name,
            config=config,
            connect_timeout=self.connect_timeout,
            connect_kwargs={"banner_timeout": self.connect_timeout, "auth_timeout": self.connect_timeout},
        )
        self.connection = connection  # _client reads its ssh config
        connection.client = self._client(self.ssh)
        hop = connection.gateway  # ProxyJump: each bastion gets the same host-key policy
        while isinstance(hop, Connection):
            hop.client = self._client(self.ssh)
            hop = hop.gateway
        return connection

    def another(self) -> RemoteHost:
        """A second connection to the same host for another thread (the serve check's lease
        renewals): one thread's reconnect never pulls the other's connection away."""
        return RemoteHost(self.name, self.ssh, self.ssh_config_path)

    def reconnect(self) -> None:
        """Drop the connection (it may be half-dead) for a fresh one on the next command."""
        with contextlib.suppress(Exception):
            self.connection.close()
        self.connection = self._connection()

    def _client(self, ssh: SshSettings) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        path = _known_hosts_path(ssh)
        if ssh.known_hosts == "accept_new":
            hashed = str(self.connection.ssh_config.get("hashknownhosts", "no")).lower() == "yes"
            client.set_missing_host_key_policy(_AcceptNew(path, hashed))
        else:
            client.set_missing_host_key_policy(_RefuseUnknown(path))
        load_known_hosts(client.get_host_keys(), path)  # never load_host_keys: that arms a rewrite
        return client

    def hostname(self) -> str:
        return self.connection.host

    def open(self) -> None:
        """Connect and authenticate within connect_timeout_s, or raise HostError saying why."""
        if self.connection.is_connected:
            return
        if self.connection.transport is not None:  # it was open and died: never reuse its client
            self.reconnect()
        where = f"{self.connection.user}@{self.connection.host}:{self.connection.port}"
        try:
            self.connection.open()
        except HostError:
            raise
        except paramiko.BadHostKeyException as err:
            raise HostError(
                f"host key of {where} does not match {_known_hosts_path(self.ssh)}: the key changed or "
                "someone is in the middle; if the change is expected, remove the old line "
                f"(`ssh-keygen -R {err.hostname}`) and trust the new key"
            ) from None
        except paramiko.AuthenticationException as err:
            raise HostError(
                f"SSH authentication to {where} failed ({err}); check the user and the key "
                "(IdentityFile in ~/.ssh/config, or an agent)"
            ) from None
        except TimeoutError as err:
            self.reconnect()
            raise TransportError(
                f"SSH to {where}: no answer within {self.connect_timeout:g} s ({err})"
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as err:
            self.reconnect()
            raise TransportError(f"SSH to {where} failed within {self.connect_timeout:g} s: {err}") from None
        server_key = self.connection.transport.get_remote_server_key() if self.connection.transport else None
        if server_key is not None and (server_key.get_name(), server_key.get_base64()) in revoked_keys(
            _known_hosts_path(self.ssh)
        ):
            self.connection.close()
            _refuse_revoked(_known_hosts_path(self.ssh), where, server_key)
        keepalive = int(self.ssh.keepalive_s)
        if keepalive and self.connection.transport is not None:
            self.connection.transport.set_keepalive(keepalive)

    def run(self, command: str, timeout: float | None = None, stdin: str | None = None) -> Result:
        """Run command in the C locale (no translated messages, plain number formats: nothing here
        depends on the host's language); `stdin` (closed after it) keeps data such as an environment
        file holding secrets off the command line."""
        self.open()
        timeout = timeout or self.command_timeout
        in_stream = io.StringIO(stdin) if stdin is not None else False
        try:
            res = self.connection.run(
                f"{C_LOCALE}{command}", hide=True, warn=True, in_stream=in_stream, timeout=timeout
            )
        except invoke.CommandTimedOut as err:
            self.reconnect()  # the command may still run there; its channel is abandoned
            raise TransportError(f"command on {self.name} timed out after {timeout:g} s: {command}") from err
        except (paramiko.SSHException, EOFError, OSError, invoke.exceptions.ThreadException) as err:
            self.reconnect()
            raise TransportError(f"the SSH link to {self.name} failed during `{command}`: {err!r}") from err
        if res.exited == NO_EXIT_STATUS:
            self.reconnect()
            raise TransportError(f"the SSH link to {self.name} dropped during `{command}` (no exit status)")
        return Result(res.exited, res.stdout, res.stderr)

    def read_file(self, path: str) -> str:
        q_path = shlex.quote(path)
        res = self.run(f"test -e {q_path} || exit {MISSING_EXIT}; cat -- {q_path}")
        if res.ok:
            return res.stdout
        if res.exited == MISSING_EXIT:  # told by the exit status, never by the (translated) message
            raise FileNotFoundError(f"{self.name}:{path} does not exist")
        raise OSError(f"cannot read {self.name}:{path}: {res.stderr.strip()}")

    def close(self) -> None:
        self.connection.close()


def open_host(server: ServerSettings, ssh_config_path: str | None = None) -> LocalHost | RemoteHost:
    """The host named by `server.host`."""
    if server.host == "local":
        return LocalHost()
    return RemoteHost(server.host, server.ssh, ssh_config_path)


def secret_file_command(path: str, sudo: bool = True) -> str:
    """The command that writes its stdin to `path`: the way text that may hold secrets (a drop-in with
    an inline `--api-key`) reaches a host without ever being part of a command line, which `ps`, sudo's
    log and the audit log would show. It needs no sudo right beyond `tee` (which the serve check
    already needs); `umask 077` makes a new file mode 0600 (sudo keeps the caller's stricter umask),
    and tee's copy of the text goes to /dev/null, not back through the connection."""
    return f"umask 077 && {'sudo -n ' if sudo else ''}tee -- {shlex.quote(path)} >/dev/null"


def write_secret_file(
    host: LocalHost | RemoteHost, path: str, text: str, sudo: bool = True, timeout: float = 60
) -> Result:
    """Write `text` to `path` on `host` through the command's stdin (see `secret_file_command`);
    returns the command's `Result` (its output scrubbed). The caller checks `result.ok`."""
    res = host.run(secret_file_command(path, sudo), timeout=timeout, stdin=text)
    return Result(res.exited, REDACTOR.scrub(res.stdout), REDACTOR.scrub(res.stderr))
