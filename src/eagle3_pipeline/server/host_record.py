"""The serve check on a systemd unit as a state machine with a durable record on the host: the unit
restarted with the draft's drop-in (dropin.py), then, in every case, put back as it was and production
verified.

- before any change: a unit with changes on disk systemd has not loaded (NeedDaemonReload=yes) is
  refused; ActiveState (active, activating, reloading: running) and the ExecStart argv are read;
- the lock is the host record `server.host_state_dir/UNIT.serve-check.json`, created atomically (`ln`)
  and naming its owner (host, pid, process start time); each phase (`locked`, `dropin`, `draft`,
  `restoring`) is recorded before its action;
- the restore removes the drop-in, reloads, starts production only if the draft may have run (never
  re-issuing a start already under way), verifies that production runs its own ExecStart, not the
  draft, and answers with its model, and removes the record LAST: a run killed anywhere leaves the
  record, and the next run (snapshot or serve check) resumes from its phase, unless its owner may
  still be running (another pipeline's live check is never touched);
- SIGTERM, SIGINT and SIGHUP become an exception while the check runs; during the restore they are
  deferred (interrupts.py);
- remote commands run in the C locale and nothing reads translated text (exit statuses, `systemctl
  show` properties); what was written through sudo is read through sudo;
- the drop-in text travels on stdin, never on a command line.

Needs on the host: `sudo -n` for mkdir, tee, ln, mv, rm, cat and systemctl (server.ssh.sudo).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import posixpath
import re
import shlex
import time
from collections.abc import Callable, Iterator
from typing import Any

from eagle3_pipeline.server import process_identity, secrets
from eagle3_pipeline.server.dropin import (
    MARKER,
    RECOVERY_DIRS,
    UNIT_DIR,
    ServeCheckError,
    dropin_path,
    dropin_text,
    new_run_id,
    parse_marker,
)
from eagle3_pipeline.server.interrupts import Interrupted, deferred_interrupts
from eagle3_pipeline.server.remote import HostError
from eagle3_pipeline.server.unit_watch import RUNNING_STATES  # read from ActiveState, not `is-active`
from eagle3_pipeline.settings import ServerSettings

log = logging.getLogger(__name__)

RESTORE_ATTEMPTS = 3
RESTORE_RETRY_S = 2.0
POLL_S = 1.0  # between two reads of ActiveState while production starts
# The record's phases, in order; each names what may have changed on the host once it is written.
LOCKED, DROPIN, DRAFT, RESTORING = "locked", "dropin", "draft", "restoring"


def _must(result: Any, what: str) -> Any:
    if not result.ok:
        raise ServeCheckError(
            f"{what} failed on the server host: {result.stderr.strip() or result.stdout.strip()}"
        )
    return result


def _prefix(sudo: bool) -> str:
    return "sudo -n " if sudo else ""


def unit_properties(host: Any, unit: str, *names: str) -> dict[str, str]:
    """`systemctl show -p A,B` as a dict: machine-readable properties, never translated text."""
    res = host.run(f"systemctl show --no-pager -p {','.join(names)} -- {shlex.quote(unit)}")
    _must(res, f"systemctl show {unit}")
    pairs = (line.partition("=") for line in res.stdout.splitlines() if "=" in line)
    return {name: value for name, _, value in pairs}


def exec_start_argv(prop: str) -> str:
    """The `argv[]=` parts of `systemctl show -p ExecStart` (its pid and start-time parts change on
    every start; the argv is what systemd will run)."""
    return " | ".join(re.findall(r"argv\[\]=(.*?) ;", prop))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()  # the argv may hold a secret: only its hash is kept


def record_path(unit: str, record_dir: str) -> str:
    """The host record (and lock) of a serve check on unit: `record_dir` (server.host_state_dir: /run,
    a tmpfs, which a reboot clears along with the runtime drop-in) / UNIT.serve-check.json."""
    dropin_path(unit)  # the same unit-name check
    return f"{record_dir}/{unit}.serve-check.json"


def read_record(host: Any, path: str, sudo: bool) -> dict[str, Any] | None:
    """The host record at path; None when there is none (told by `test`'s exit status, not by text)."""
    if not host.run(f"test -e {shlex.quote(path)}").ok:
        return None
    text = _must(host.run(f"{_prefix(sudo)}cat -- {shlex.quote(path)}"), f"reading {path}").stdout
    try:
        return json.loads(text)
    except ValueError:
        raise ServeCheckError(f"{host.name}:{path} is not a serve-check record; move it away") from None


def _put_record(host: Any, path: str, record: dict[str, Any], sudo: bool, exclusive: bool = False) -> bool:
    """Write the record (world-readable: it holds no secret, only hashes) to a temporary file, then
    move it into place, or, `exclusive`, hard-link it there, which fails when a record is already there:
    that is the lock. One command. False when exclusive and held."""
    prefix, q_path = _prefix(sudo), shlex.quote(path)
    tmp = shlex.quote(f"{path}.{record['run']}.tmp")
    text = shlex.quote(json.dumps(record, sort_keys=True))
    write = f"umask 022 && printf '%s\\n' {text} | {prefix}tee -- {tmp} >/dev/null"
    if not exclusive:
        _must(host.run(f"{write} && {prefix}mv -f -- {tmp} {q_path}"), f"writing {path}")
        return True
    res = host.run(
        f"{write} || exit 2; {prefix}ln -- {tmp} {q_path}; held=$?; {prefix}rm -f -- {tmp}; exit $held"
    )
    if res.exited == 2:
        _must(res, f"writing {path}")
    return res.ok


def _owner_text(record: dict[str, Any]) -> str:
    owner = record.get("owner") or {}
    return (
        f"run {record.get('run')} by pid {owner.get('pid')} on {owner.get('host')} "
        f"(process start {owner.get('start_ticks')} ticks after boot), phase {record.get('phase')}"
    )


def _refuse_live(host: Any, path: str, record: dict[str, Any]) -> None:
    """Raise when the record's owner may still run: alive on this machine, or on another machine."""
    running = process_identity.is_running(record.get("owner") or {})
    if running is False:
        return
    where = "is still running" if running else "ran on another machine, whose process cannot be checked"
    raise ServeCheckError(
        f"{host.name}:{path}: the serve check of another pipeline ({_owner_text(record)}) {where}; "
        "wait for it to finish. If it is gone for good, restore the unit by hand (see docs/validation.md) "
        "and remove that file"
    )


def _set(host: Any, path: str, record: dict[str, Any], sudo: bool, **fields: Any) -> None:
    record.update(fields)
    if not record.get("legacy"):  # a drop-in restored without a record (see `restore`) writes none
        _put_record(host, path, record, sudo)


class _StepFailed(RuntimeError):
    """A restore step that did not reach its goal (the message says why)."""


def _retried(host: Any, action: Callable[[], None], what: str) -> str | None:
    """Run a restore step until it succeeds (RESTORE_ATTEMPTS tries, reconnecting after SSH errors);
    None when it succeeded, else why it failed. Each step checks the state first, so a retry never
    re-issues what already happened."""
    why = ""
    for attempt in range(1, RESTORE_ATTEMPTS + 1):
        try:
            action()
        except HostError as err:
            why = str(err)
            host.close()  # the next try reconnects
        except (_StepFailed, ServeCheckError) as err:
            why = str(err)
        else:
            return None
        log.warning("restore step %s failed (attempt %d/%d): %s", what, attempt, RESTORE_ATTEMPTS, why)
        if attempt < RESTORE_ATTEMPTS:
            time.sleep(RESTORE_RETRY_S)
    return why


def _command(host: Any, command: str, timeout: float | None = None) -> Callable[[], None]:
    def run() -> None:
        res = host.run(command, timeout=timeout)
        if not res.ok:
            raise _StepFailed(f"exit {res.exited}: {(res.stderr or res.stdout).strip()}")

    return run


def _ensure_production_started(host: Any, unit: str, record: dict[str, Any], path: str, sudo: bool,
                               timeout_s: float) -> Callable[[], None]:  # fmt: skip
    """A step: start production unless a start issued after the draft's is already under way (a
    health-gated start can take longer than one try: re-issuing it would kill the load), then wait
    for ActiveState=active."""

    def step() -> None:
        props = unit_properties(host, unit, "ActiveState", "InvocationID")
        current = props.get("InvocationID") or None
        draft = record.get("draft_invocation")
        if props.get("ActiveState") in RUNNING_STATES and current is not None and draft and current != draft:
            log.info("%s is %s since the draft: waiting for it", unit, props["ActiveState"])
        else:
            if current and not draft:
                _set(host, path, record, sudo, draft_invocation=current)  # what runs now is not production
            _command(host, f"{_prefix(sudo)}systemctl restart --no-block -- {shlex.quote(unit)}")()
        deadline = time.monotonic() + timeout_s
        while (state := unit_properties(host, unit, "ActiveState").get("ActiveState")) != "active":
            if state in ("failed", "inactive") or time.monotonic() >= deadline:
                raise _StepFailed(f"{unit} is {state} after its start (ActiveState)")
            time.sleep(POLL_S)

    return step


def _verify_production(host: Any, unit: str, record: dict[str, Any], sudo: bool,
                       verify: Callable[[], None] | None) -> None:  # fmt: skip
    """Raise unless the unit is production again: the ExecStart systemd holds is production's (as
    read before the check), the main process does not run the draft, and `verify` (health, model)."""
    props = unit_properties(host, unit, "ExecStart", "MainPID", "ActiveState")
    if (
        record.get("production_exec")
        and _digest(exec_start_argv(props.get("ExecStart", ""))) != record["production_exec"]
    ):
        raise ServeCheckError(f"{unit}'s ExecStart is not production's as it was before the check")
    draft_path, pid = record.get("draft_path"), props.get("MainPID", "0")
    if draft_path and pid.isdigit() and pid != "0":
        res = host.run(f"{_prefix(sudo)}cat -- /proc/{pid}/cmdline")
        if res.ok and draft_path in res.stdout:
            raise ServeCheckError(f"{unit}'s main process (pid {pid}) still runs the draft {draft_path}")
    if record.get("was_active") and verify is not None:
        try:
            verify()
        except Exception as err:
            raise _StepFailed(f"{unit} was restored but production is not back: {err}") from err


def restore_from_record(
    host: Any, record: dict[str, Any], path: str, sudo: bool = True, timeout_s: float = 720,
    verify: Callable[[], None] | None = None,
) -> None:  # fmt: skip
    """Put the unit back as the record says it was: remove the drop-in, reload, and (only when the
    draft may have run) restart production if it was running, else stop it; verify that production
    runs again; remove the record LAST. Every step checks first and is retried.

    Raises:
        ServeCheckError: a step still failed; the record stays, so the next run resumes; the message
            lists what to run by hand.
    """
    unit, dropin = record["unit"], record["dropin"]
    prefix, q_unit, q_dropin = _prefix(sudo), shlex.quote(unit), shlex.quote(dropin)
    draft_ran = record.get("phase") in (DRAFT, RESTORING)
    steps: list[tuple[str, Callable[[], None]]] = [
        (f"removing {dropin}", _command(host, f"{prefix}rm -f -- {q_dropin} && test ! -e {q_dropin}")),
        ("systemctl daemon-reload", _command(host, f"{prefix}systemctl daemon-reload")),
    ]
    if draft_ran and record.get("was_active"):
        steps.append(
            (f"starting {unit}", _ensure_production_started(host, unit, record, path, sudo, timeout_s))
        )
    elif draft_ran:
        steps.append(
            (f"systemctl stop {unit}", _command(host, f"{prefix}systemctl stop -- {q_unit}", timeout_s))
        )
    steps.append((f"verifying {unit}", lambda: _verify_production(host, unit, record, sudo, verify)))
    steps.append((f"removing {path}", _command(host, f"{prefix}rm -f -- {shlex.quote(path)}")))
    with deferred_interrupts() as received:
        if draft_ran and record.get("phase") != RESTORING:
            _retried(host, lambda: _set(host, path, record, sudo, phase=RESTORING), "recording the restore")
        for what, action in steps:
            why = _retried(host, action, what)
            if why is not None:
                start = f"systemctl {'restart' if record.get('was_active') else 'stop'} {unit}"
                manual = f"sudo rm -f -- {dropin} && sudo systemctl daemon-reload" + (
                    f" && sudo {start}" if draft_ran else ""
                )
                raise ServeCheckError(
                    f"restoring {unit} on {host.name} failed at {what} ({why}); production may still run "
                    f"the draft. The record {path} stays: the next run resumes the restore. Run by hand: "
                    f"{manual}, then check the unit and remove {path}"
                )
        log.info(
            "serve check restore: %s removed, daemon-reload, %s; production verified, record removed",
            dropin, (f"{unit} {'restarted' if record.get('was_active') else 'stopped'}" if draft_ran
                     else "the draft never ran: production untouched"),
        )  # fmt: skip
    if received:
        raise Interrupted(received[0])


def restore(
    host: Any, unit: str, path: str, was_active: bool, sudo: bool = True, timeout_s: float = 720,
    verify: Callable[[], None] | None = None,
) -> None:  # fmt: skip
    """Restore a unit from a drop-in alone (one written before the host record existed): as if the
    draft had run."""
    record = {"unit": unit, "dropin": path, "phase": RESTORING, "was_active": was_active, "legacy": True}
    no_record = f"{path}.no-record"  # never written: removing it is a no-op
    restore_from_record(host, record | {"run": "legacy"}, no_record, sudo, timeout_s, verify)


@contextlib.contextmanager
def draft_dropin(
    host: Any, unit: str, exec_start: str, *, record_dir: str, sudo: bool = True, timeout_s: float = 720,
    unit_dir: str | None = None, before_restart: Callable[[], None] | None = None,
    verify: Callable[[], None] | None = None, draft_path: str | None = None,
) -> Iterator[str]:  # fmt: skip
    """The serve check's state machine on the host. Before any change: refuse a unit with changes on
    disk systemd has not loaded, read production's state, and take the lock by creating the host
    record (`record_path`). Then, each phase recorded before its action: `dropin` (the drop-in written,
    daemon-reload; `before_restart`, the checkpoint's hash check, runs here), `draft` (restart with the
    draft; its InvocationID recorded). On exit, whatever happened, `restore_from_record`. Yields the
    run id."""
    prefix, q_unit = _prefix(sudo), shlex.quote(unit)
    path, rpath = dropin_path(unit, unit_dir or UNIT_DIR), record_path(unit, record_dir)
    props = unit_properties(host, unit, "ActiveState", "NeedDaemonReload", "ExecStart")
    if props.get("NeedDaemonReload") == "yes":
        raise ServeCheckError(
            f"{unit} on {host.name} has changes on disk that systemd has not loaded (NeedDaemonReload=yes): "
            "a restore would start the edited unit, not what runs now. Load them yourself (systemctl "
            "daemon-reload, then restart it) or revert the edit, then rerun; nothing was changed"
        )
    was_active = props.get("ActiveState") in RUNNING_STATES
    run_id = new_run_id()
    record: dict[str, Any] = {
        "unit": unit, "run": run_id, "owner": process_identity.identity(), "phase": LOCKED,
        "was_active": was_active, "active_state_before": props.get("ActiveState"), "dropin": path,
        "production_exec": _digest(exec_start_argv(props.get("ExecStart", ""))), "draft_path": draft_path,
        "draft_invocation": None,
    }  # fmt: skip
    _must(
        host.run(f"{prefix}mkdir -p -- {shlex.quote(posixpath.dirname(rpath))}"), "mkdir of the record folder"
    )
    if not _put_record(host, rpath, record, sudo, exclusive=True):
        held = read_record(host, rpath, sudo) or {}
        raise ServeCheckError(
            f"another serve check holds {unit} on {host.name} ({_owner_text(held)}); nothing was changed"
        )
    try:
        _set(host, rpath, record, sudo, phase=DROPIN)
        _must(
            host.run(f"{prefix}mkdir -p -- {shlex.quote(posixpath.dirname(path))}"),
            "mkdir of the drop-in folder",
        )
        text = dropin_text(exec_start, run_id, was_active)
        _must(secrets.write_secret_file(host, path, text, sudo), f"writing {path}")
        if before_restart is not None:
            before_restart()
        _must(host.run(f"{prefix}systemctl daemon-reload"), "systemctl daemon-reload")
        _set(host, rpath, record, sudo, phase=DRAFT)
        _must(
            host.run(f"{prefix}systemctl restart -- {q_unit}", timeout=timeout_s), f"systemctl restart {unit}"
        )
        invocation = unit_properties(host, unit, "InvocationID").get("InvocationID") or None
        _set(host, rpath, record, sudo, draft_invocation=invocation)
        yield run_id
    except BaseException as err:
        log.warning("serve check ends early (%s): restoring %s", type(err).__name__, unit)
        restore_from_record(host, record, rpath, sudo, timeout_s, verify)
        raise
    else:
        restore_from_record(host, record, rpath, sudo, timeout_s, verify)


def recover_leftover(
    host: Any, unit: str, *, record_dir: str, sudo: bool = True, timeout_s: float = 720,
    unit_dirs: tuple[str, ...] | None = None, verify: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Finish what a previous serve check left (killed, connection lost): first its host record
    (refused while its owner may still run), then any drop-in of ours without one (older versions).

    Returns:
        One {'path', 'run', 'was_active'} per check restored (empty when none was found).

    Raises:
        ServeCheckError: a live check of another pipeline, a file at our path that we did not write,
            or the restore failed.
    """
    found = []
    rpath = record_path(unit, record_dir)
    record = read_record(host, rpath, sudo)
    if record is not None:
        _refuse_live(host, rpath, record)
        log.warning(
            "found the record of an unfinished serve check (%s) at %s:%s: restoring %s first",
            _owner_text(record), host.name, rpath, unit,
        )  # fmt: skip
        restore_from_record(host, record, rpath, sudo, timeout_s, verify)
        found.append({"path": record["dropin"], "run": record["run"], "was_active": record["was_active"]})
    for unit_dir in unit_dirs or RECOVERY_DIRS:
        path = dropin_path(unit, unit_dir)
        if not host.run(f"test -e {shlex.quote(path)}").ok:
            continue
        res = host.run(f"{_prefix(sudo)}cat -- {shlex.quote(path)}")  # written through sudo: read so too
        if not res.ok:
            raise ServeCheckError(f"cannot read {host.name}:{path}: {res.stderr.strip()}")
        marker = parse_marker(res.stdout)
        if marker is None:
            raise ServeCheckError(
                f"{host.name}:{path} exists but was not written by eagle3-pipeline (no '{MARKER}' line): "
                "it changes the unit the serve check would restore; move it away or rename it"
            )
        was_active = marker["was_active"]
        if was_active is None:  # legacy: the state before is unknown; keep the unit as it is now
            active = unit_properties(host, unit, "ActiveState").get("ActiveState")
            was_active = active in RUNNING_STATES
        log.warning(
            "found the drop-in of an unfinished serve check (run %s) at %s:%s: restoring %s first",
            marker["run"], host.name, path, unit,
        )  # fmt: skip
        restore(host, unit, path, was_active, sudo, timeout_s, verify)
        found.append({"path": path, "run": marker["run"], "was_active": was_active})
    return found


def recover_leftover_dropin(server: ServerSettings) -> list[dict[str, Any]]:
    """`recover_leftover` on the configured host; nothing to do where the pipeline runs the unit as a
    local process (no systemd). Called first by snapshot_server, so that a draft command left in the
    unit is never snapshotted as production."""
    from eagle3_pipeline.server.backend import uses_local_process
    from eagle3_pipeline.server.remote import open_host

    if uses_local_process(server):
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
    """A blocking restart stops the old server first (minutes for a tensor-parallel one)."""
    return server.stop_timeout_s + 120
