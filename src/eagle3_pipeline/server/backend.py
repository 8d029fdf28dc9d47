"""How the pipeline runs one server, decided once (`backend_class`; `backend_for` builds it):

- `LocalProcessBackend`: `server.host: local` with `server.unit_file`, on a machine without systemd:
  the pipeline runs the unit's ExecStart itself (local_process.py).
- `SystemdUnitBackend`: everywhere else: systemd runs the unit (this machine, or a host over SSH) and
  the pipeline starts and stops it with `[sudo -n] systemctl` (unit_watch.py). A unit whose ExecStart
  runs a container (`docker run`, `podman run`) is such a unit: its command is read through the
  container (vllm_args.py, container.py), its lifecycle is the unit's.

Both record who started the server (ownership.py) and stop only what is theirs to stop.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from eagle3_pipeline.server import tls_verify
from eagle3_pipeline.server.health import wait_healthy
from eagle3_pipeline.server.local_process import find_local, launch_local, local_command
from eagle3_pipeline.server.ownership import clear_ownership, record_ownership
from eagle3_pipeline.server.remote import TransportError, retry_transport
from eagle3_pipeline.server.unit_watch import RUNNING_STATES, UnitWatch
from eagle3_pipeline.settings import ServerSettings

log = logging.getLogger(__name__)
START_ATTEMPTS = 3  # a start sent again only when systemd, read again, never saw it


def _has_systemd() -> bool:
    return Path("/run/systemd/system").is_dir()


def uses_local_process(server: ServerSettings) -> bool:
    """True where the pipeline runs the unit's ExecStart itself (local unit_file, no systemd)."""
    return bool(server.local_unit_file) and not _has_systemd()


class ServerBackend(ABC):
    """Starting and stopping one server whose state (lock, ownership, pid file, log) is in state_dir."""

    runs_local_process: ClassVar[bool]

    def __init__(self, server: ServerSettings, state_dir: Path) -> None:
        self.server, self.state_dir = server, Path(state_dir)

    @abstractmethod
    def start(self, base_url: str, headers: dict[str, str]) -> None:
        """Start the server, record whether the pipeline started it, and wait for /health (the caller
        holds the state lock)."""

    @abstractmethod
    def stop(self, owner: dict[str, Any]) -> dict[str, Any]:
        """Stop the server when `owner` (the ownership record) says it is ours, or server.stop_foreign;
        what was done (the caller holds the state lock)."""


class LocalProcessBackend(ServerBackend):
    runs_local_process = True

    @property
    def name(self) -> str:
        """The pid file's and log's name in state_dir."""
        return self.server.unit.replace("/", "_")

    def start(self, base_url: str, headers: dict[str, str]) -> None:
        proc = find_local(self.state_dir, self.name)
        if proc is None:
            argv, env, cwd = local_command(self.server)
            proc = launch_local(argv, env, cwd, self.state_dir, self.name)
        record_ownership(self.state_dir, True, self.server, pid=proc.pid)
        wait_healthy(
            base_url, float(self.server.start_timeout_s), proc.log_tail, proc.alive, headers,
            verify=tls_verify(self.server),
        )  # fmt: skip

    def stop(self, owner: dict[str, Any]) -> dict[str, Any]:
        proc = find_local(self.state_dir, self.name)  # only a process whose pid file is ours
        if proc is None:
            return {"action": "none", "why": "no process started by the pipeline is running"}
        proc.stop()
        clear_ownership(self.state_dir)
        return {"action": "stopped", "pid": proc.pid}


class SystemdUnitBackend(ServerBackend):
    runs_local_process = False

    def start(self, base_url: str, headers: dict[str, str]) -> None:
        server = self.server
        log.info("starting %s on %s with systemctl", server.unit, server.host)
        watch = UnitWatch(server)
        try:
            before = retry_transport(lambda: watch.show("ActiveState", "InvocationID"), "systemctl show")
            active = before.get("ActiveState")
            if active in RUNNING_STATES:  # running or loading (a health-gated start): someone else's
                log.info("%s is already %s: waiting for it, not starting it", server.unit, active)
                record_ownership(self.state_dir, False, server)
            else:
                self._start_recorded(watch, before.get("InvocationID") or None)
            wait_healthy(
                base_url, float(server.start_timeout_s), watch.journal, watch.alive, headers,
                exited_why=lambda: f"{server.unit} stopped running (systemd state {watch.state})",
                verify=tls_verify(server),
            )  # fmt: skip
        finally:
            watch.close()

    def _start_recorded(self, watch: UnitWatch, before: str | None) -> None:
        """Record that the pipeline sends a start BEFORE sending it (a start that outlives the SSH
        timeout, or a link lost on the way, still leaves the record), send it without waiting for the
        unit to be up (`--no-block`: a health-gated start can take longer than any SSH timeout), and
        after a lost link read systemd again: sent again only when it never reached the host."""
        server = self.server
        record_ownership(
            self.state_dir, True, server, invocation_before=before, invocation_id=None, pending=True
        )
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                watch.systemctl("start --no-block")
                break
            except TransportError as err:
                now = retry_transport(lambda: watch.show("ActiveState", "InvocationID"), "systemctl show")
                if (now.get("InvocationID") or None) != before or now.get("ActiveState") in RUNNING_STATES:
                    break  # it reached systemd
                if attempt == START_ATTEMPTS:
                    raise
                log.warning("the start of %s never reached the host (%s): sending it again", server.unit, err)
        invocation = retry_transport(watch.invocation_id, "systemctl show")
        ours = invocation is not None and invocation != before  # a new one: this start
        record_ownership(self.state_dir, ours, server, invocation_before=before, invocation_id=invocation)

    def stop(self, owner: dict[str, Any]) -> dict[str, Any]:
        server = self.server
        watch = UnitWatch(server)
        try:
            current = retry_transport(watch.invocation_id, "systemctl show")
            recorded = owner.get("invocation_id")  # unknown (old systemd, a failed show): not ours
            if owner.get("pending") and current is not None and current != owner.get("invocation_before"):
                recorded = current  # the job that sent the start died before reading its InvocationID
            ours = bool(owner.get("started_by_pipeline")) and recorded is not None and recorded == current
            if not ours and not server.stop_foreign:
                why = (
                    "the pipeline did not start it" if not owner.get("started_by_pipeline")
                    else "it was restarted since the pipeline started it (another InvocationID)"
                )  # fmt: skip
                log.info("leaving %s running: %s (server.stop_foreign: false)", server.unit, why)
                return {
                    "action": "left running",
                    "why": f"{why}; set server.stop_foreign: true to stop it anyway",
                }
            state = watch.stop(float(server.stop_timeout_s))
        finally:
            watch.close()
        clear_ownership(self.state_dir)
        return {"action": "stopped", "state": state}


def backend_class(server: ServerSettings) -> type[ServerBackend]:
    """The one place the choice is made: see the module docstring. (Callers with no state folder, such
    as the recovery of a serve check's host record, ask the class.)"""
    return LocalProcessBackend if uses_local_process(server) else SystemdUnitBackend


def backend_for(server: ServerSettings, state_dir: Path) -> ServerBackend:
    """The configured server's backend (`backend_class`), its state in state_dir."""
    return backend_class(server)(server, state_dir)
