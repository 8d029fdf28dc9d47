"""The server as a local process, where this machine has no systemd: the unit file's ExecStart run with
its environment and working directory, detached in its own session, with a pid file (pid and start
time) and a scrubbed log under the state folder."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from eagle3_pipeline import io, secrets
from eagle3_pipeline.server import process_identity
from eagle3_pipeline.server.health import ServerError
from eagle3_pipeline.server.process_identity import pid_alive
from eagle3_pipeline.server.remote import LocalHost
from eagle3_pipeline.server.service_context import user_home, working_directory
from eagle3_pipeline.server.snapshot import parse_service, read_unit_text
from eagle3_pipeline.settings import ServerSettings

log = logging.getLogger(__name__)
BASE_ENV_VARS = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR", "TZ")
LOG_TAIL_LINES = 40


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


def local_command(server: ServerSettings) -> tuple[list[str], dict[str, str], str | None]:
    """(argv, environment, working directory) of the local unit file's ExecStart, secrets included:
    for running it, never for writing it anywhere."""
    host = LocalHost()
    unit, env, argv, command = parse_service(read_unit_text(host, server), server.unit, host)
    if not argv:
        raise ServerError(f"{server.unit_file}: no ExecStart= to run")
    secrets.redact_env(env)  # remember the secret values, so that logs and errors scrub them
    secrets.redact_flags(command.flags)
    if unit.working_directory is None:
        return argv, env, None  # a local unit without WorkingDirectory= runs where the pipeline runs
    # `~` is the User's home and a specifier is unknown, as systemd reads them (service_context)
    home = user_home(unit, host) if unit.working_directory == "~" else None
    cwd = working_directory(unit, home)
    if cwd is None:
        raise ServerError(
            f"{server.unit_file}: WorkingDirectory={unit.working_directory} cannot be resolved here"
        )
    return argv, env, cwd
