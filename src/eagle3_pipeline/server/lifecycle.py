"""Starting, checking and stopping the vLLM server when the pipeline manages it (`server.manage`).

Where systemd runs the unit (a remote host, or this machine with systemd) it is started and stopped
with `sudo -n systemctl`. On a machine without systemd (`server.host: local` with `server.unit_file`)
the unit's ExecStart runs with its environment and working directory as a supervised background
process in its own session, with a pid file and a log under the state folder. A file lock there makes
parallel generation shard jobs start it exactly once.

Ownership: `ownership.json` in the state folder says whether the pipeline started the server
(`started_by_pipeline`) and which start it was (systemd's InvocationID, or the local pid). After
generation only a server the pipeline started, and still the same start, is stopped, unless
`server.stop_foreign` says otherwise: a server that was already serving users stays up.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from eagle3_pipeline import io
from eagle3_pipeline.server import auth_headers, process_identity, secrets, tls_verify
from eagle3_pipeline.server.health import check_health
from eagle3_pipeline.server.process_identity import pid_alive
from eagle3_pipeline.server.remote import HostError, LocalHost, open_host
from eagle3_pipeline.server.snapshot import parse_service, read_unit_text
from eagle3_pipeline.settings import SERVER_DEFAULTS, SSH_DEFAULTS

log = logging.getLogger(__name__)
BASE_ENV_VARS = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR", "TZ")
LOG_TAIL_LINES = 40
JOURNAL_LINES = 50
OWNERSHIP_FILE = "ownership.json"
STOPPED_STATES = ("inactive", "failed", "unknown")  # `systemctl is-active` words for a unit not running
# ActiveState values of a unit whose process runs or is being started: `systemctl start` then does
# nothing, and `systemctl is-active` exits non-zero for the last two (systemd.unit(5), systemctl(1)).
RUNNING_STATES = ("active", "activating", "reloading")


class ServerError(RuntimeError):
    """The server did not come up (or is not the expected one); the message carries the log tail."""


@dataclass
class LocalProcess:
    """A server process started by `launch_local`: its pid, pid file and log."""

    pid: int
    pid_file: Path
    log_path: Path
    filter_pid: int | None = None  # the process writing the log (see log_filter)

    def alive(self) -> bool:
        return pid_alive(self.pid)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        if self.filter_pid is not None and not self.alive():  # let the filter write the last lines
            deadline = time.monotonic() + 5
            while pid_alive(self.filter_pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        return tail(self.log_path, lines)

    def stop(self, timeout_s: float = 30) -> bool:
        """SIGTERM the process group, SIGKILL after timeout_s; True when something was stopped."""
        stopped = _terminate(self.pid, timeout_s)
        self.pid_file.unlink(missing_ok=True)
        return stopped


def _terminate(pid: int, timeout_s: float) -> bool:
    if not pid_alive(pid):
        return False
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return True
            time.sleep(0.2)
    return not pid_alive(pid)


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log file, secrets scrubbed ('' when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64_000))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return secrets.REDACTOR.scrub("\n".join(text.splitlines()[-lines:]))


def launch_local(
    argv: list[str], env: dict[str, str], cwd: str | None, state_dir: Path, name: str
) -> LocalProcess:
    """Start argv in the background, detached in its own session, with `env` on top of a minimal
    systemd-like environment; stdout and stderr go to state_dir/NAME.log, the pid to NAME.pid."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path, pid_file = state_dir / f"{name}.log", state_dir / f"{name}.pid"
    full_env = {k: os.environ[k] for k in BASE_ENV_VARS if k in os.environ}
    full_env.update(env)
    with open(log_path, "ab") as out:
        out.write(f"--- starting {name} at {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
    redaction = state_dir / f"{name}.redaction.json"  # fingerprints only, for the log filter
    io.write_text(json.dumps(secrets.REDACTOR.export_known()), redaction)
    proc = subprocess.Popen(
        argv, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    # vLLM prints its arguments (the API key too): the log is written through a scrubbing filter
    log_filter = subprocess.Popen(
        [sys.executable, "-m", "eagle3_pipeline.server.log_filter", str(log_path), str(redaction)],
        stdin=proc.stdout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()  # the filter holds the pipe: it ends when the server closes its output
    ticks = process_identity.start_ticks(proc.pid)
    io.write_text(f"{proc.pid} {ticks}\n", pid_file)  # the start time: a reused pid is never ours
    log.info("started %s (pid %d), log %s", name, proc.pid, log_path)
    return LocalProcess(proc.pid, pid_file, log_path, log_filter.pid)


def find_local(state_dir: Path, name: str) -> LocalProcess | None:
    """The process a pid file in state_dir names, when it is still alive and still the same process
    (its start time as recorded): a stale pid file, its pid reused by another program, names nothing."""
    pid_file = Path(state_dir) / f"{name}.pid"
    try:
        pid_text, _, ticks_text = pid_file.read_text().strip().partition(" ")
        pid, ticks = int(pid_text), int(ticks_text)
    except (OSError, ValueError):
        return None  # no file, or one without the start time: whose pid it is cannot be known
    proc = LocalProcess(pid, pid_file, Path(state_dir) / f"{name}.log")
    if process_identity.start_ticks(pid) != ticks:
        log.warning("%s names pid %d, now another process (or none): not ours", pid_file, pid)
        return None
    return proc if proc.alive() else None


def wait_healthy(
    base_url: str,
    timeout_s: float,
    log_tail: Callable[[], str] | None = None,
    alive: Callable[[], bool] | None = None,
    headers: dict[str, str] | None = None,
    exited_why: Callable[[], str] | None = None,
    verify: bool | str = True,
) -> None:
    """Poll /health until it answers 200; raise ServerError with the log tail on timeout or as soon as
    `alive` (the local process, or the unit's state polled beside /health) says it is gone. `verify`:
    what an https server is verified with (server.ca_bundle, see `tls_verify`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check_health(base_url, headers, verify=verify):
            return
        exited = alive is not None and not alive()
        if exited or time.monotonic() >= deadline:
            if exited:
                why = exited_why() if exited_why else "the server process exited"
            else:
                why = f"no healthy /health within {timeout_s:g} s"
            tail_text = log_tail() if log_tail else ""
            raise ServerError(f"{base_url}: {why}. Last lines of the server log:\n{tail_text or '(empty)'}")
        time.sleep(1)


def check_model(
    base_url: str, served_model_name: str, headers: dict[str, str] | None = None, verify: bool | str = True
) -> None:
    """Raise ServerError unless /v1/models lists served_model_name."""
    try:
        resp = requests.get(f"{base_url}/v1/models", headers=headers or {}, timeout=30, verify=verify)
        resp.raise_for_status()
        ids = [m.get("id") for m in resp.json().get("data", [])]
    except (requests.RequestException, ValueError) as err:
        raise ServerError(f"{base_url}/v1/models failed: {secrets.REDACTOR.scrub(str(err))}") from None
    if served_model_name not in ids:
        raise ServerError(
            f"{base_url} serves {ids}, not {served_model_name!r} from the snapshot: another server holds the "
            "port, or the unit changed since the snapshot (rerun snapshot_server)"
        )


@contextlib.contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """An exclusive lock on state_dir/lifecycle.lock, shared by all jobs using this server."""
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(state_dir) / "lifecycle.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def uses_local_process(server_cfg: dict[str, Any]) -> bool:
    """True where the pipeline runs the unit's ExecStart itself (local, unit_file, no systemd)."""
    return (
        server_cfg.get("host", SERVER_DEFAULTS.host) == "local"
        and bool(server_cfg.get("unit_file"))
        and not _has_systemd()
    )


def _has_systemd() -> bool:
    return Path("/run/systemd/system").is_dir()


def local_command(server_cfg: dict[str, Any]) -> tuple[list[str], dict[str, str], str | None]:
    """(argv, environment, working directory) of the local unit file's ExecStart, secrets included:
    for running it, never for writing it anywhere."""
    host = LocalHost()
    unit, env, argv, command = parse_service(read_unit_text(host, server_cfg), server_cfg["unit"], host)
    if not argv:
        raise ServerError(f"{server_cfg['unit_file']}: no ExecStart= to run")
    secrets.redact_env(env)  # remember the secret values, so that logs and errors scrub them
    secrets.redact_flags(command.flags)
    return argv, env, unit.working_directory


def _process_name(server_cfg: dict[str, Any]) -> str:
    return server_cfg["unit"].replace("/", "_")


class UnitWatch:
    """The systemd side of a unit on its host (one SSH connection): actions, state and journal.

    `alive()` is polled beside /health while waiting for a start, at most every `interval_s`: a unit
    whose state turns `failed`/`inactive`, or that systemd is restarting after a crash (SubState
    `auto-restart`), ends the wait at once instead of after server.start_timeout_s.
    """

    def __init__(self, server_cfg: dict[str, Any], interval_s: float = 3.0) -> None:
        self.unit = server_cfg["unit"]
        self.sudo = "sudo -n " if server_cfg.get("ssh", {}).get("sudo", SSH_DEFAULTS.sudo) else ""
        self.host = open_host(server_cfg)
        self.interval_s = interval_s
        self.state = "unknown"
        self._checked_at = -float("inf")

    def systemctl(self, action: str, timeout: float | None = None) -> str:
        """Run `[sudo -n] systemctl ACTION -- UNIT`; its stdout, or ServerError saying what to fix."""
        res = self.host.run(f"{self.sudo}systemctl {action} -- {shlex.quote(self.unit)}", timeout=timeout)
        if not res.ok:
            raise ServerError(
                f"`{self.sudo}systemctl {action} {self.unit}` on {self.host.name} failed: "
                f"{secrets.REDACTOR.scrub(res.stderr.strip())}"
                + (
                    " (sudo needs a NOPASSWD rule for systemctl, or set server.ssh.sudo: false)"
                    if self.sudo
                    else ""
                )
            )
        return res.stdout

    def show(self, *properties: str) -> dict[str, str]:
        """`systemctl show -p A,B` as a dict (read-only: no sudo)."""
        res = self.host.run(
            f"systemctl show --no-pager -p {','.join(properties)} -- {shlex.quote(self.unit)}"
        )
        pairs = (line.partition("=") for line in res.stdout.splitlines() if "=" in line)
        return {name: value for name, _, value in pairs} if res.ok else {}

    def is_active(self) -> str:
        """`systemctl is-active` (active, activating, deactivating, inactive, failed, ...)."""
        res = self.host.run(f"systemctl is-active -- {shlex.quote(self.unit)}")
        return (res.stdout.strip().splitlines() or ["unknown"])[-1]

    def alive(self) -> bool:
        if time.monotonic() - self._checked_at < self.interval_s:
            return True
        self._checked_at = time.monotonic()
        state = self.show("ActiveState", "SubState")
        active, sub = state.get("ActiveState") or self.is_active(), state.get("SubState", "")
        self.state = f"{active}/{sub}" if sub else active
        return active not in ("failed", "inactive") and sub != "auto-restart"

    def invocation_id(self) -> str | None:
        """systemd's id of the unit's current start (a new one on every start); None when unknown."""
        return self.show("InvocationID").get("InvocationID") or None

    def journal(self, lines: int = JOURNAL_LINES) -> str:
        """The unit's journal tail, secrets scrubbed."""
        try:
            res = self.host.run(f"{self.sudo}journalctl -u {shlex.quote(self.unit)} -n {lines} --no-pager")
        except HostError as err:
            return f"(journal unavailable: {err})"
        return secrets.REDACTOR.scrub(res.stdout if res.ok else res.stderr)

    def stop(self, timeout_s: float) -> str:
        """`systemctl stop --no-block`, then poll is-active until the unit is down (a tensor-parallel
        server can take minutes); its final state, or ServerError with the journal tail."""
        self.systemctl("stop --no-block")
        deadline = time.monotonic() + timeout_s
        while (state := self.is_active()) not in STOPPED_STATES:
            if time.monotonic() >= deadline:
                raise ServerError(
                    f"{self.unit} on {self.host.name} is still {state} {timeout_s:g} s after "
                    f"`systemctl stop` (server.stop_timeout_s). Journal:\n{self.journal()}"
                )
            time.sleep(min(2.0, self.interval_s))
        return state

    def close(self) -> None:
        self.host.close()


def read_ownership(state_dir: Path) -> dict[str, Any] | None:
    """The ownership record (see the module docstring); None when nothing is recorded."""
    try:
        return json.loads((Path(state_dir) / OWNERSHIP_FILE).read_text())
    except (OSError, ValueError):
        return None


def record_ownership(
    state_dir: Path, started_by_pipeline: bool, server_cfg: dict[str, Any], **extra: Any
) -> None:
    """Write ownership.json atomically (under the state lock)."""
    record = {
        "started_by_pipeline": started_by_pipeline,
        "unit": server_cfg["unit"],
        "host": server_cfg.get("host", SERVER_DEFAULTS.host),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **extra,
    }
    path = Path(state_dir) / OWNERSHIP_FILE
    io.write_json(record, path, indent=2, sort_keys=True)
    log.info("ownership of %s: %s", server_cfg["unit"], "started by the pipeline" if started_by_pipeline else
             "already running, not started by the pipeline: it will be left running")  # fmt: skip


def _start(server_cfg: dict[str, Any], state_dir: Path, base_url: str, headers: dict[str, str]) -> None:
    """Start the server, record that the pipeline started it, and wait for /health."""
    timeout = float(server_cfg.get("start_timeout_s", SERVER_DEFAULTS.start_timeout_s))
    if uses_local_process(server_cfg):
        name = _process_name(server_cfg)
        proc = find_local(state_dir, name)
        if proc is None:
            argv, env, cwd = local_command(server_cfg)
            proc = launch_local(argv, env, cwd, state_dir, name)
        record_ownership(state_dir, True, server_cfg, pid=proc.pid)
        wait_healthy(base_url, timeout, proc.log_tail, proc.alive, headers, verify=tls_verify(server_cfg))
        return
    log.info("starting %s on %s with systemctl", server_cfg["unit"], server_cfg.get("host"))
    watch = UnitWatch(server_cfg)
    try:
        before = watch.show("ActiveState", "InvocationID")
        if before.get("ActiveState") in RUNNING_STATES:  # loading (health-gated start): someone else's
            log.info("%s is already %s: waiting for it, not starting it", watch.unit, before["ActiveState"])
            record_ownership(state_dir, False, server_cfg)
        else:
            watch.systemctl("start")
            invocation = watch.invocation_id()
            if invocation is None or invocation == before.get("InvocationID"):  # unknown: not ours
                record_ownership(state_dir, False, server_cfg, invocation_id=invocation)
            else:
                record_ownership(state_dir, True, server_cfg, invocation_id=invocation)
        wait_healthy(
            base_url, timeout, watch.journal, watch.alive, headers,
            exited_why=lambda: f"{server_cfg['unit']} stopped running (systemd state {watch.state})",
            verify=tls_verify(server_cfg),
        )  # fmt: skip
    finally:
        watch.close()


def server_url(server_json: dict[str, Any], server_cfg: dict[str, Any], state_dir: Path) -> str:
    """The URL requests go to: server.base_url, or through the SSH tunnel, or the snapshot's."""
    if server_cfg.get("base_url"):
        return server_cfg["base_url"].rstrip("/")
    if server_cfg.get("tunnel") and server_cfg.get("host", SERVER_DEFAULTS.host) != "local":
        from eagle3_pipeline.server.tunnel import get_tunnel

        return get_tunnel(server_json, server_cfg, state_dir).url(auth_headers(server_cfg))
    return server_json["base_url"].rstrip("/")


def _record_foreign(server_cfg: dict[str, Any], state_dir: Path) -> None:
    """A server found answering, with no record of ours: note that the pipeline did not start it."""
    if read_ownership(state_dir) is None:
        record_ownership(state_dir, False, server_cfg)


def ensure_running(server_json: dict[str, Any], server_cfg: dict[str, Any], state_dir: Path) -> str:
    """The base URL of a healthy server serving the snapshot's model, starting it when managed.

    Whoever started it, the model is checked (`/v1/models` lists served_model_name), and who started it
    is recorded in state_dir/ownership.json for `stop`.
    """
    secrets.learn(server_json)  # log tails and errors of this job hide the unit's secrets
    headers, verify = auth_headers(server_cfg), tls_verify(server_cfg)
    base_url = server_url(server_json, server_cfg, state_dir)
    if check_health(base_url, headers, verify=verify):
        with state_lock(state_dir):
            _record_foreign(server_cfg, Path(state_dir))
    elif not server_cfg.get("manage", SERVER_DEFAULTS.manage):
        raise ServerError(
            f"{base_url}/health does not answer and server.manage is false: start {server_cfg['unit']} "
            "yourself, or set server.manage: true"
        )
    else:
        with state_lock(state_dir):
            if check_health(base_url, headers, verify=verify):  # another job may have started it meanwhile
                _record_foreign(server_cfg, Path(state_dir))
            else:
                _start(server_cfg, Path(state_dir), base_url, headers)
    check_model(base_url, server_json["served_model_name"], headers, verify)
    log.info("server %s is up and serves %s", base_url, server_json["served_model_name"])
    return base_url


def stop(server_json: dict[str, Any], server_cfg: dict[str, Any], state_dir: Path) -> dict[str, Any]:
    """Stop the server after generation when configured and ours to stop; returns what was done.

    Ours: ownership.json says the pipeline started it and (systemd) the unit's InvocationID is still
    that start's. `server.stop_foreign: true` stops it whoever started it.
    """
    secrets.learn(server_json)  # a journal tail in an error hides the unit's secrets
    report: dict[str, Any] = {
        "unit": server_cfg["unit"],
        "host": server_cfg.get("host", SERVER_DEFAULTS.host),
    }
    if not (
        server_cfg.get("manage", SERVER_DEFAULTS.manage)
        and server_cfg.get("stop_after_generation", SERVER_DEFAULTS.stop_after_generation)
    ):
        return {
            **report,
            "action": "left running",
            "why": "server.manage or server.stop_after_generation is off",
        }
    with state_lock(state_dir):
        owner = read_ownership(state_dir) or {}
        report["started_by_pipeline"] = bool(owner.get("started_by_pipeline"))
        if uses_local_process(server_cfg):
            proc = find_local(state_dir, _process_name(server_cfg))
            if proc is None:
                return {**report, "action": "none", "why": "no process started by the pipeline is running"}
            proc.stop()
            (Path(state_dir) / OWNERSHIP_FILE).unlink(missing_ok=True)
            return {**report, "action": "stopped", "pid": proc.pid}
        return {**report, **_stop_unit(server_cfg, Path(state_dir), owner)}


def _stop_unit(server_cfg: dict[str, Any], state_dir: Path, owner: dict[str, Any]) -> dict[str, Any]:
    watch = UnitWatch(server_cfg)
    try:
        current = watch.invocation_id()
        recorded = owner.get("invocation_id")  # unknown (old systemd, a failed show): not ours
        ours = bool(owner.get("started_by_pipeline")) and recorded is not None and recorded == current
        if not ours and not server_cfg.get("stop_foreign", SERVER_DEFAULTS.stop_foreign):
            why = (
                "the pipeline did not start it" if not owner.get("started_by_pipeline")
                else "it was restarted since the pipeline started it (another InvocationID)"
            )  # fmt: skip
            log.info("leaving %s running: %s (server.stop_foreign: false)", server_cfg["unit"], why)
            return {
                "action": "left running",
                "why": f"{why}; set server.stop_foreign: true to stop it anyway",
            }
        state = watch.stop(float(server_cfg.get("stop_timeout_s", SERVER_DEFAULTS.stop_timeout_s)))
    finally:
        watch.close()
    (state_dir / OWNERSHIP_FILE).unlink(missing_ok=True)
    return {"action": "stopped", "state": state}


def write_stop_report(report: dict[str, Any], path: str | Path) -> None:
    io.write_json(report, path, indent=2, sort_keys=True)
