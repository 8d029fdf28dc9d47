"""The serve check on a systemd host as a state machine with a durable record: the draft runs in a
unit of its own (check_unit.py) that conflicts production; production's unit is never written, and no
daemon-reload is ever issued. The restore is systemd's: the check unit's ExecStopPost starts
production again (when it was running) however the check unit stops.

- before any change: a production unit with changes on disk systemd has not loaded
  (NeedDaemonReload=yes) is refused (the snapshot would not be what runs); production's ActiveState,
  InvocationID and execution settings are read from `systemctl show`;
- the lock is the host record `server.host_state_dir/UNIT.serve-check.json`, created atomically (`ln`)
  and naming its owner (host, boot id, PID namespace, pid, process start time), the check unit and
  what to restore; each phase (`locked`, `starting`, `running`) is recorded BEFORE its action;
- refusals before anything changes (`preflight`): a systemd older than check_unit.MIN_SYSTEMD, a
  unit type the check cannot reproduce, a required EnvironmentFile= that is missing, sudo rules that
  do not allow a command the check runs (the message gives the sudoers line to add);
- the check unit is started with `systemd-run --no-block`; after a lost link, a timeout or a refusal
  the state is read from systemd again before anything else: a check unit systemd knows is ours and
  running, one it does not know never reached the host (the start is sent again: its unique name makes
  a duplicate impossible);
- a lease (check_unit.lease_argv): a transient timer that stops the check unit `server.check_lease_s`
  after its last renewal; a thread with its own connection renews it while the pipeline lives, so a
  pipeline killed mid-check leaves production down for the lease, the check unit's stop and
  production's start, not for the whole RuntimeMaxSec;
- the restore: stop the check unit if systemd still has it (ExecStopPost starts production), wait for
  production, start production ONLY if it was running, is not running, and has not been started since
  the check began (its InvocationID is still the one before: the pipeline's check stopped it and
  nothing started it), verify production (its own command, health, model), remove the record LAST;
- every SSH step reconnects on a transport error (remote.retry_transport) and re-reads before acting;
- a record is recovered automatically only when its owner is provably gone (same host, boot and PID
  namespace, and its pid no longer that process); otherwise the error says how to recover by hand.

Needs on the host: `sudo -n` for SUDO_COMMANDS (server.ssh.sudo), checked first.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from eagle3_pipeline.server import check_unit, process_identity
from eagle3_pipeline.server.check_record import (
    manual_recovery,
    must,
    owner_text,
    put_record,
    read_record,
    record_path,
    refuse_unproven,
    run_retried,
    set_fields,
    sudo_prefix,
)
from eagle3_pipeline.server.draft_command import LEGACY_DIRS, LEGACY_DROPIN_NAME, ServeCheckError, new_run_id
from eagle3_pipeline.server.interrupts import Interrupted, deferred_interrupts
from eagle3_pipeline.server.remote import TransportError, retry_transport, write_secret_file
from eagle3_pipeline.server.unit_watch import RUNNING_STATES  # read from ActiveState, not `is-active`
from eagle3_pipeline.settings import ServerSettings

log = logging.getLogger(__name__)

POLL_S = 1.0  # between two reads of a unit's state while it starts or stops
LEASE_RENEWALS = 4  # renewals per lease: three may be lost (a slow link) before the lease runs out
# what the check runs through `sudo -n` (server.ssh.sudo): record and env file (mkdir, tee, mv, ln,
# cmp, rm, cat), the check unit and its lease (systemd-run, systemctl)
SUDO_COMMANDS = ("systemd-run", "systemctl", "mkdir", "tee", "mv", "ln", "cmp", "rm", "cat")
START_ATTEMPTS = 3  # systemd-run sent again only when systemd, read again, does not know the unit
# The record's phases, in order; each names what may have changed on the host once it is written.
LOCKED, STARTING, RUNNING = "locked", "starting", "running"


def show(host: Any, unit: str, *names: str) -> dict[str, list[str]]:
    """`systemctl show -p A,B` (machine-readable, never translated), read again after a lost link."""
    res = run_retried(host, f"systemctl show --no-pager -p {','.join(names)} -- {shlex.quote(unit)}", "show")
    must(res, f"systemctl show {unit}")
    return check_unit.parse_show(res.stdout)


def state(host: Any, unit: str) -> dict[str, str]:
    """A unit's LoadState, ActiveState, InvocationID and MainPID (the last value of each)."""
    props = show(host, unit, "LoadState", "ActiveState", "SubState", "InvocationID", "MainPID")
    return {k: v[-1] for k, v in props.items()}


def systemd_version(host: Any) -> int:
    """The host's systemd version (`systemctl --version`: "systemd 252 (252.38-1~deb12u1)")."""
    res = must(run_retried(host, "systemctl --version", "version"), "systemctl --version")
    match = re.match(r"systemd (\d+)", res.stdout.strip())
    if not match:
        raise ServeCheckError(f"cannot read the systemd version on {host.name}: {res.stdout[:200]!r}")
    return int(match[1])


def _sudo_refused(host: Any) -> list[str]:
    """The SUDO_COMMANDS (as paths on the host) that `sudo -n` does not allow the SSH user."""
    probe = (
        f'for c in {" ".join(SUDO_COMMANDS)}; do p=$(command -v "$c") || {{ echo "$c"; continue; }}; '
        'sudo -n -l "$p" >/dev/null 2>&1 || echo "$p"; done'
    )
    return run_retried(host, probe, "sudo -l").stdout.split()


def preflight(host: Any, unit: str, props: dict[str, list[str]], sudo: bool) -> None:
    """Refuse, before anything changes, what the check could not do right on this host.

    Raises:
        ServeCheckError: naming the setting to change or the sudoers line to add.
    """
    version = systemd_version(host)
    if version < check_unit.MIN_SYSTEMD:
        raise ServeCheckError(
            f"{host.name} runs systemd {version}; the serve check needs {check_unit.MIN_SYSTEMD} or newer "
            "(transient units with ExecStopPost= and --collect). Set validate.serve_check: false for "
            "this host; nothing was changed"
        )
    if why := check_unit.unreproducible(props):
        raise ServeCheckError(
            f"the serve check cannot run {unit} as its own unit: {why}; nothing was changed"
        )
    for path, required in check_unit.env_files(props):
        if required and not any(c in path for c in "*?[") and not run_retried(
            host, f"{sudo_prefix(sudo)}cat -- {shlex.quote(path)} >/dev/null", "env file"
        ).ok:  # fmt: skip
            raise ServeCheckError(
                f"{unit}'s EnvironmentFile={path} is missing or unreadable on {host.name}: production "
                "itself would not start. Restore the file (or mark it optional with `-`), then rerun; "
                "nothing was changed"
            )
    if sudo and (refused := _sudo_refused(host)):
        user = run_retried(host, "id -un", "id").stdout.strip() or "USER"
        raise ServeCheckError(
            f"sudo on {host.name} does not let {user} run {', '.join(refused)} without a password, which "
            f"the serve check needs. Add to /etc/sudoers.d/eagle3-pipeline: `{user} ALL=(root) NOPASSWD: "
            f"{', '.join(refused)}` (or set server.ssh.sudo: false when connecting as root); "
            "nothing was changed"
        )


class Lease:
    """Renews the check unit's lease timer from a thread with its own connection while the pipeline
    lives; `renewals` counts the renewals that reached systemd (for the tests and the log)."""

    def __init__(self, host: Any, check: str, lease_s: float, sudo: bool) -> None:
        self.host, self.timer = host, f"{check_unit.lease_name(check)}.timer"
        self.interval_s, self.sudo = max(0.5, lease_s / LEASE_RENEWALS), sudo
        self.renewals, self._done = 0, threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"lease {check}", daemon=True)

    def __enter__(self) -> Lease:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=self.interval_s + 30)

    def _renew(self) -> None:
        other = self.host.another()
        restart = f"{sudo_prefix(self.sudo)}systemctl restart --no-block -- {shlex.quote(self.timer)}"
        try:
            while not self._done.wait(self.interval_s):
                try:
                    if other.run(restart, timeout=self.interval_s * 2).ok:
                        self.renewals += 1
                    else:
                        log.warning("renewing %s was refused", self.timer)
                except Exception as err:  # a lost link: the next renewal tries a fresh connection
                    log.warning("renewing %s failed (%s): the lease runs on", self.timer, err)
                    with contextlib.suppress(Exception):
                        other.reconnect()
        finally:
            other.close()


@dataclass
class CheckRun:
    """A running check unit: what the caller needs to watch it and to trust its figures."""

    host: Any
    name: str
    invocation: str | None
    run_id: str

    def still_serving(self) -> None:
        """Raise unless the check unit still runs the same start: figures taken while production (or
        another start) served are not the draft's."""
        now = state(self.host, self.name)
        if now.get("ActiveState") != "active" or now.get("InvocationID") != self.invocation:
            raise ServeCheckError(
                f"{self.name} stopped or restarted during the measurement ({now.get('ActiveState')}): "
                "the figures may not be the draft's; rerun the check"
            )


def _reached(host: Any, record: dict[str, Any]) -> bool:
    """After a lost link: did systemd-run reach systemd? Yes when systemd knows the check unit, or
    (a check unit that already stopped and was collected) production is no longer the start it was."""
    if state(host, record["check_unit"]).get("LoadState") not in (None, "not-found"):
        return True
    prod = state(host, record["unit"])
    moved = (prod.get("InvocationID") or None) != record.get("invocation_before")
    return bool(record.get("was_active")) and (moved or prod.get("ActiveState") not in RUNNING_STATES)


def _start_check(
    host: Any, record: dict[str, Any], argv: list[str], sudo: bool, timeout_s: float
) -> str | None:
    """Send systemd-run; after a lost link read systemd again and send it again only when it never
    reached systemd (at most START_ATTEMPTS times). Then wait until the check unit runs (production's
    stop comes first). Its InvocationID."""
    name, command = record["check_unit"], f"{sudo_prefix(sudo)}{shlex.join(argv)}"
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            res = host.run(command)
            if not res.ok and not _reached(host, record):  # refused: systemd knows nothing of it
                must(res, f"systemd-run {name}")
            break
        except TransportError as err:
            log.warning("the link dropped while starting %s (%s): reading systemd again", name, err)
            if _reached(host, record):
                break
            if attempt == START_ATTEMPTS:
                raise ServeCheckError(f"starting {name} never reached {host.name}: {err}") from None
    return _wait_running(host, name, timeout_s)


def _wait_running(host: Any, name: str, timeout_s: float) -> str | None:
    """The check unit's InvocationID once it runs; ServeCheckError when it stopped (crashed: Restart=no)
    or is not running within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = state(host, name)
        if now.get("ActiveState") == "active" and now.get("MainPID", "0") != "0":
            return now.get("InvocationID") or None
        if now.get("ActiveState") == "failed" or now.get("LoadState") == "not-found":
            raise ServeCheckError(
                f"{name} stopped as it started (the draft's server exited: see its journal)"
            )
        if time.monotonic() > deadline:
            raise ServeCheckError(f"{name} is not running {timeout_s:g} s after its start")
        time.sleep(POLL_S)


@contextlib.contextmanager
def serve_check_unit(
    host: Any, unit: str, argv: list[str], *, record_dir: str, sudo: bool = True,
    runtime_max_s: float = 3600, timeout_s: float = 720, draft_path: str | None = None,
    before_start: Callable[[], None] | None = None, verify: Callable[[], None] | None = None,
    expand_environment: bool = True, lease_s: float = 120,
) -> Iterator[CheckRun]:  # fmt: skip
    """The serve check's state machine on the host (see the module docstring). Yields the running
    check unit; on exit, whatever happened, `restore_from_record`."""
    props = show(host, unit, "NeedDaemonReload", "ActiveState", "InvocationID", *check_unit.SHOWN)
    last = {k: v[-1] for k, v in props.items()}
    if last.get("LoadState") not in (None, "loaded"):
        raise ServeCheckError(f"{unit} on {host.name} is {last.get('LoadState')}, not a loaded unit")
    if last.get("NeedDaemonReload") == "yes":
        raise ServeCheckError(
            f"{unit} on {host.name} has changes on disk that systemd has not loaded (NeedDaemonReload=yes): "
            "the snapshot is not what runs. Load them yourself (systemctl daemon-reload, then restart it) "
            "or revert the edit, then rerun; nothing was changed"
        )
    preflight(host, unit, props, sudo)
    rpath, run_id = record_path(unit, record_dir), new_run_id()
    name = check_unit.unit_name(run_id)
    env = check_unit.environment(props)
    record: dict[str, Any] = {
        "unit": unit, "check_unit": name, "run": run_id, "owner": process_identity.identity(),
        "phase": LOCKED, "was_active": last.get("ActiveState") in RUNNING_STATES,
        "active_state_before": last.get("ActiveState"), "invocation_before": last.get("InvocationID") or None,
        "draft_path": draft_path, "env_file": f"{record_dir}/{name}.env" if env else None,
        "lease": f"{check_unit.lease_name(name)}.timer",
    }  # fmt: skip
    must(
        run_retried(host, f"{sudo_prefix(sudo)}mkdir -p -- {shlex.quote(record_dir)}", "mkdir"),
        "mkdir of the record folder",
    )
    if not put_record(host, rpath, record, sudo, exclusive=True):
        held = read_record(host, rpath, sudo) or {}
        raise ServeCheckError(
            f"another serve check holds {unit} on {host.name} ({owner_text(held)}); nothing was changed"
        )
    try:
        if env:
            text = check_unit.env_file_text(env)
            must(retry_transport(lambda: write_secret_file(host, record["env_file"], text, sudo),
                                  "env file"), "writing the check unit's environment")  # fmt: skip
        if before_start is not None:
            before_start()
        run_argv = check_unit.systemd_run_argv(
            name, unit, argv, props, was_active=record["was_active"], runtime_max_s=runtime_max_s,
            systemctl="systemctl", own_env_file=record["env_file"],
            expand_environment=expand_environment,
        )  # fmt: skip
        set_fields(host, rpath, record, sudo, phase=STARTING)
        lease = check_unit.lease_argv(name, lease_s, "systemctl")  # armed first: it covers the start
        must(
            run_retried(host, f"{sudo_prefix(sudo)}{shlex.join(lease)}", "lease"), f"arming {record['lease']}"
        )
        with Lease(host, name, lease_s, sudo):
            invocation = _start_check(host, record, run_argv, sudo, timeout_s)
            set_fields(host, rpath, record, sudo, phase=RUNNING, check_invocation=invocation)
            yield CheckRun(host, name, invocation, run_id)
    except BaseException as err:
        log.warning("serve check ends early (%s): restoring %s", type(err).__name__, unit)
        restore_from_record(host, record, rpath, sudo, timeout_s, verify)
        raise
    else:
        restore_from_record(host, record, rpath, sudo, timeout_s, verify)


def _stop_check(host: Any, record: dict[str, Any], sudo: bool, timeout_s: float) -> None:
    """Stop the check unit while systemd still has it (its ExecStopPost starts production), and wait
    until systemd has forgotten it."""
    name = record["check_unit"]
    deadline = time.monotonic() + timeout_s
    sent = False
    while (now := state(host, name)).get("LoadState") == "loaded" and now.get("ActiveState") != "inactive":
        if not sent and now.get("ActiveState") != "deactivating":
            stop = f"{sudo_prefix(sudo)}systemctl stop --no-block -- {shlex.quote(name)}"
            must(run_retried(host, stop, "stop"), f"systemctl stop {name}")
            sent = True
        if time.monotonic() > deadline:
            raise ServeCheckError(f"{name} is still {now.get('ActiveState')} {timeout_s:g} s after its stop")
        time.sleep(POLL_S)


def _production_back(host: Any, record: dict[str, Any], sudo: bool, timeout_s: float) -> str:
    """Wait for production after the check unit stopped (its ExecStopPost starts it); start it only
    when the pipeline knows its check stopped it and nothing started it since. What was done."""
    unit = record["unit"]
    if record.get("phase") == LOCKED:
        return f"the check unit never started: {unit} untouched"
    if not record.get("was_active"):
        return f"{unit} was not running before the check: left as it is"
    now = state(host, unit)
    untouched = now.get("InvocationID") == record.get("invocation_before") and record.get("invocation_before")
    if now.get("ActiveState") not in RUNNING_STATES and untouched:  # a start queued by systemd merges
        log.warning("%s was stopped by the check and not started again: starting it once", unit)
        start = f"{sudo_prefix(sudo)}systemctl start --no-block -- {shlex.quote(unit)}"
        must(run_retried(host, start, "start"), f"systemctl start {unit}")
    deadline, grace = time.monotonic() + timeout_s, time.monotonic() + 10 * POLL_S
    while now.get("ActiveState") != "active":
        stopped = now.get("ActiveState") in ("failed", "inactive")
        if (stopped and time.monotonic() > grace) or time.monotonic() > deadline:
            raise ServeCheckError(f"{unit} is {now.get('ActiveState')} after the check unit stopped")
        time.sleep(POLL_S)
        now = state(host, unit)
    return f"{unit} running again"


def _verify_production(
    host: Any, record: dict[str, Any], sudo: bool, verify: Callable[[], None] | None
) -> None:
    """Raise unless production's main process does not run the draft and `verify` (health, model)."""
    pid = state(host, record["unit"]).get("MainPID", "0")
    draft = record.get("draft_path")
    if draft and pid.isdigit() and pid != "0":
        res = run_retried(host, f"{sudo_prefix(sudo)}cat -- /proc/{pid}/cmdline", "cmdline")
        if res.ok and draft in res.stdout:
            raise ServeCheckError(f"{record['unit']}'s main process (pid {pid}) runs the draft {draft}")
    if verify is not None:
        verify()


def restore_from_record(
    host: Any, record: dict[str, Any], path: str, sudo: bool = True, timeout_s: float = 720,
    verify: Callable[[], None] | None = None,
) -> None:  # fmt: skip
    """Undo the check as the record says: stop the check unit if systemd has it, production back only
    as described in the module docstring, our env file removed, the record removed LAST.

    Raises:
        ServeCheckError: a step failed; the record stays, and the message says what to run by hand.
    """
    unit = record["unit"]
    with deferred_interrupts() as received:
        try:
            if record.get("phase") in (STARTING, RUNNING):
                _stop_check(host, record, sudo, timeout_s)
            if record.get("lease"):  # not loaded (never armed, or fired and collected): nothing to stop
                stop_lease = f"{sudo_prefix(sudo)}systemctl stop --no-block -- {shlex.quote(record['lease'])}"
                run_retried(host, stop_lease, "stop lease")
            done = _production_back(host, record, sudo, timeout_s)
            if record.get("was_active") and record.get("phase") in (STARTING, RUNNING):
                _verify_production(host, record, sudo, verify)
            if record.get("env_file"):
                run_retried(host, f"{sudo_prefix(sudo)}rm -f -- {shlex.quote(record['env_file'])}", "rm env")
            must(
                run_retried(host, f"{sudo_prefix(sudo)}rm -f -- {shlex.quote(path)}", "rm record"),
                f"removing {path}",
            )
        except (ServeCheckError, TransportError) as err:
            raise ServeCheckError(
                f"restoring {unit} on {host.name} after the serve check failed ({err}). The record {path} "
                f"stays: the next run resumes it. By hand: {manual_recovery(record, path)}"
            ) from None
        except Exception as err:  # verify(): production is not answering as before
            raise ServeCheckError(
                f"{unit} on {host.name} is not back as production after the serve check: {err}. "
                f"The record {path} stays. By hand: {manual_recovery(record, path)}"
            ) from err
        log.info("serve check restore: %s stopped; %s; record removed", record.get("check_unit"), done)
    if received:
        raise Interrupted(received[0])


def _refuse_legacy_dropin(host: Any, unit: str) -> None:
    """A drop-in an older version left on the production unit: reported with what to run by hand
    (removing it needs a daemon-reload, which would also load an operator's unloaded edits)."""
    for folder in LEGACY_DIRS:
        path = f"{folder}/{unit}.d/{LEGACY_DROPIN_NAME}"
        if run_retried(host, f"test -e {shlex.quote(path)}", "test").ok:
            raise ServeCheckError(
                f"{host.name}:{path} is a serve-check drop-in left by an older eagle3-pipeline: production "
                f"may run the draft. By hand: sudo rm {path} && sudo systemctl daemon-reload && sudo "
                f"systemctl restart {unit} (if it should run), then rerun"
            )


def recover_leftover(
    host: Any, unit: str, *, record_dir: str, sudo: bool = True, timeout_s: float = 720,
    verify: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Finish what a previous serve check left (killed, connection lost), only when its owner is
    provably gone; refuse a legacy drop-in.

    Returns:
        One {'check_unit', 'run', 'was_active'} per check recovered (empty when none was found).
    """
    _refuse_legacy_dropin(host, unit)
    rpath = record_path(unit, record_dir)
    record = read_record(host, rpath, sudo)
    if record is None:
        return []
    refuse_unproven(host, rpath, record)
    log.warning("found the record of an unfinished serve check (%s): restoring %s", owner_text(record), unit)
    restore_from_record(host, record, rpath, sudo, timeout_s, verify)
    return [
        {"check_unit": record.get("check_unit"), "run": record["run"], "was_active": record["was_active"]}
    ]


def recover_leftover_check(server: ServerSettings) -> list[dict[str, Any]]:
    """`recover_leftover` on the configured host; nothing to do where the pipeline runs the unit as a
    local process (no systemd). Called first by snapshot_server, so that a check in progress (or left
    by a killed run) is never snapshotted as production."""
    from eagle3_pipeline.server.backend import backend_class
    from eagle3_pipeline.server.remote import open_host

    if backend_class(server).runs_local_process:  # no systemd: no check unit, no host record
        return []
    host = open_host(server)
    try:
        return recover_leftover(
            host, server.unit, record_dir=server.host_state_dir, sudo=server.ssh.sudo,
            timeout_s=restart_timeout_s(server),
        )  # fmt: skip
    finally:
        host.close()


def restart_timeout_s(server: ServerSettings) -> float:
    """A stop of a tensor-parallel server takes minutes, then production's start."""
    return server.stop_timeout_s + 120
