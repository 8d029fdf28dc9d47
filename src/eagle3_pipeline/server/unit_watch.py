"""A systemd unit on its host, seen through `systemctl` and `journalctl` (one SSH connection, or this
machine): start/stop actions, its state while a start is awaited, its InvocationID and its journal."""

from __future__ import annotations

import shlex
import time

from eagle3_pipeline import secrets
from eagle3_pipeline.server.health import ServerError
from eagle3_pipeline.server.remote import HostError, TransportError, open_host, retry_transport
from eagle3_pipeline.settings import ServerSettings

JOURNAL_LINES = 50
STOPPED_STATES = ("inactive", "failed", "unknown")  # `systemctl is-active` words for a unit not running
# ActiveState values of a unit whose process runs or is being started: `systemctl start` then does
# nothing, and `systemctl is-active` exits non-zero for the last two (systemd.unit(5), systemctl(1)).
RUNNING_STATES = ("active", "activating", "reloading")


class UnitWatch:
    """The systemd side of a unit on its host (one SSH connection): actions, state and journal.

    `alive()` is polled beside /health while waiting for a start, at most every `interval_s`: a unit
    whose state turns `failed`/`inactive`, or that systemd is restarting after a crash (SubState
    `auto-restart`), ends the wait at once instead of after server.start_timeout_s.
    """

    def __init__(self, server: ServerSettings, interval_s: float = 3.0, unit: str | None = None) -> None:
        self.unit = unit or server.unit  # `unit`: another unit on the same host (the serve check's)
        self.sudo = "sudo -n " if server.ssh.sudo else ""
        self.host = open_host(server)
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
        try:
            state = self.show("ActiveState", "SubState")
        except TransportError:  # unknown, not gone: the next poll reconnects
            return True
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
        retry_transport(self._stop_once, f"stopping {self.unit}")
        deadline = time.monotonic() + timeout_s
        while (state := retry_transport(self.is_active, "systemctl is-active")) not in STOPPED_STATES:
            if time.monotonic() >= deadline:
                raise ServerError(
                    f"{self.unit} on {self.host.name} is still {state} {timeout_s:g} s after "
                    f"`systemctl stop` (server.stop_timeout_s). Journal:\n{self.journal()}"
                )
            time.sleep(min(2.0, self.interval_s))
        return state

    def _stop_once(self) -> None:
        """`systemctl stop --no-block`, unless systemd, read first, says it is stopped or stopping
        (safe to repeat after a lost link)."""
        if self.is_active() not in (*STOPPED_STATES, "deactivating"):
            self.systemctl("stop --no-block")

    def close(self) -> None:
        self.host.close()
