"""The serve check's host record, which is also its lock: `server.host_state_dir/UNIT.serve-check.json`,
created atomically (a hard link that fails when a record is there), naming its owner (host, boot id,
PID namespace, pid, start time), the check unit and what to restore; and the helpers every step of
the check uses on the host (sudo prefix, reads retried after a lost link). A record is recovered
automatically only when its owner is provably gone (process_identity.is_running is False)."""

from __future__ import annotations

import json
import shlex
from typing import Any

from eagle3_pipeline import secrets
from eagle3_pipeline.server import process_identity
from eagle3_pipeline.server.draft_command import ServeCheckError
from eagle3_pipeline.server.remote import retry_transport


def must(result: Any, what: str) -> Any:
    """The result of a host command, or ServeCheckError with its (scrubbed) error."""
    if not result.ok:
        err = secrets.REDACTOR.scrub(result.stderr.strip() or result.stdout.strip())
        raise ServeCheckError(f"{what} failed on the server host: {err}")
    return result


def sudo_prefix(sudo: bool) -> str:
    """`sudo -n ` (never prompt) when server.ssh.sudo, else nothing."""
    return "sudo -n " if sudo else ""


def run_retried(host: Any, command: str, what: str, timeout: float | None = None) -> Any:
    """A read (or a state-checked step): retried after a transport error, on a fresh connection."""
    return retry_transport(lambda: host.run(command, timeout=timeout), what)


def record_path(unit: str, record_dir: str) -> str:
    """The host record (and lock) of a serve check on unit: `record_dir` (server.host_state_dir: /run,
    a tmpfs, which a reboot clears along with transient units) / UNIT.serve-check.json."""
    if "/" in unit or not unit.endswith(".service") or unit.startswith("."):
        raise ServeCheckError(f"server.unit {unit!r} is not a NAME.service unit name")
    return f"{record_dir}/{unit}.serve-check.json"


def read_record(host: Any, path: str, sudo: bool) -> dict[str, Any] | None:
    """The host record at path; None when there is none (told by `test`'s exit status, not by text)."""
    if not run_retried(host, f"test -e {shlex.quote(path)}", "test").ok:
        return None
    text = must(
        run_retried(host, f"{sudo_prefix(sudo)}cat -- {shlex.quote(path)}", "read"), f"reading {path}"
    ).stdout
    try:
        return json.loads(text)
    except ValueError:
        raise ServeCheckError(f"{host.name}:{path} is not a serve-check record; move it away") from None


def put_record(host: Any, path: str, record: dict[str, Any], sudo: bool, exclusive: bool = False) -> bool:
    """Write the record (world-readable: it holds no secret) to a temporary file, then move it into
    place, or, `exclusive`, hard-link it there, which fails when a record is already there: that is
    the lock. One command; repeating it after a lost link is safe (the same content, the same name).
    False when exclusive and held by another run."""
    prefix, q_path = sudo_prefix(sudo), shlex.quote(path)
    tmp = shlex.quote(f"{path}.{record['run']}.tmp")
    text = shlex.quote(json.dumps(record, sort_keys=True))
    write = f"umask 022 && printf '%s\\n' {text} | {prefix}tee -- {tmp} >/dev/null"
    if not exclusive:
        must(
            run_retried(host, f"{write} && {prefix}mv -f -- {tmp} {q_path}", "write record"),
            f"writing {path}",
        )
        return True
    mine = f"{prefix}cmp -s -- {tmp} {q_path} && exit 0"  # a lost link after our own ln: ours
    res = run_retried(
        host, f"{write} || exit 2; {prefix}ln -- {tmp} {q_path} || {{ {mine}; held=1; }}; "
        f"{prefix}rm -f -- {tmp}; exit ${{held:-0}}", "lock",
    )  # fmt: skip
    if res.exited == 2:
        must(res, f"writing {path}")
    return res.ok


def set_fields(host: Any, path: str, record: dict[str, Any], sudo: bool, **fields: Any) -> None:
    record.update(fields)
    put_record(host, path, record, sudo)


def owner_text(record: dict[str, Any]) -> str:
    owner = record.get("owner") or {}
    return (
        f"run {record.get('run')} by pid {owner.get('pid')} on {owner.get('host')} "
        f"({owner.get('pid_ns')}), phase {record.get('phase')}, check unit {record.get('check_unit')}"
    )


def manual_recovery(record: dict[str, Any], path: str) -> str:
    """What an operator runs by hand: stop the check unit (systemd then starts production if it was
    running), start production only if it was running and is not, remove the record."""
    check, unit = record.get("check_unit"), record.get("unit")
    start = (
        f"then, only if `systemctl is-active {unit}` is not active: sudo systemctl start {unit}; "
        if record.get("was_active") else f"{unit} was not running before the check: leave it; "
    )  # fmt: skip
    return f"sudo systemctl stop {check} (nothing to undo on disk); {start}then sudo rm -f {path}"


def refuse_unproven(host: Any, path: str, record: dict[str, Any]) -> None:
    """Raise unless the record's owner is provably gone (process_identity.is_running is False)."""
    owner = record.get("owner") or {}
    if process_identity.is_running(owner) is False:
        return
    raise ServeCheckError(
        f"{host.name}:{path}: a serve check ({owner_text(record)}) holds {record.get('unit')}; its "
        f"owner {process_identity.where_text(owner)}, so it is not provably gone and nothing was changed. "
        f"Wait for it to finish; if it is gone for good, recover by hand: {manual_recovery(record, path)}"
    )
