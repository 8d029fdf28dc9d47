"""The serve check in production: the same systemd unit, restarted with the draft, then restored.

On the GPU box the target occupies every GPU, so the draft cannot be served beside it: the check
installs a RUNTIME drop-in `/run/systemd/system/UNIT.d/zz-eagle3-serve-check.conf` (gone on reboot)
that resets ExecStart and sets it to the unit's own command plus `--speculative-config` (and
`--enforce-eager` when configured), runs `daemon-reload` and `restart`, measures, and in every case
removes the drop-in, reloads, and puts the unit back as it was (restarted when it was active, stopped
when it was not), then checks that production answers /health and serves its model again. Drop-ins
of all unit folders are applied in file-name order, so `zz-` wins over the unit's own.

Safety, because this touches a production server:
- the drop-in is written inside the guarded block, so a failure while writing it is restored too;
- every restore step is checked (its exit status) and retried; a step that still fails raises an
  error that lists the commands to run by hand;
- SIGTERM (a SLURM cancel) and SIGINT become an exception while the check runs, so the restore runs;
  during the restore further signals are deferred;
- the drop-in's first line is a marker with our name, a run id and the unit's state before: at the
  start of every run (snapshot and serve check) a leftover one (SIGKILL, a lost connection) is found
  and restored before anything else, and a file at our path without the marker is refused;
- the checkpoint goes to a private folder with its sha256 checked on the host (`remote_checkpoint`);
- the drop-in text travels on stdin, never on a command line.

Needs on the host: `sudo -n` for mkdir, tee, rm and systemctl (server.ssh.sudo).
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import re
import shlex
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from eagle3_pipeline.server import secrets
from eagle3_pipeline.server.remote import HostError
from eagle3_pipeline.server.unit import ExecCommand, split_words
from eagle3_pipeline.server.vllm_args import SHELLS, find_vllm
from eagle3_pipeline.settings import SERVER_DEFAULTS, SSH_DEFAULTS
from eagle3_pipeline.validate.interrupts import Interrupted, deferred_interrupts, interrupts_as_exceptions
from eagle3_pipeline.validate.serving import ServeCheckError, with_speculative_draft

log = logging.getLogger(__name__)

DROPIN_NAME = "zz-eagle3-serve-check.conf"
UNIT_DIR = "/run/systemd/system"  # runtime: a drop-in here does not survive a reboot
LEGACY_UNIT_DIR = "/etc/systemd/system"  # where versions before the runtime drop-in wrote it
RECOVERY_DIRS = (UNIT_DIR, LEGACY_UNIT_DIR)  # searched for a leftover drop-in of ours
MARKER = "# eagle3-pipeline serve_check"
_MARKER_LINE = re.compile(rf"^{re.escape(MARKER)} run=(?P<run>\S+) was_active=(?P<was_active>yes|no)\b")
_LEGACY_MARKER = "# Written by eagle3-pipeline's serve_check"
RESTORE_ATTEMPTS = 3
RESTORE_RETRY_S = 2.0


def systemd_quote(word: str) -> str:
    """One ExecStart word, double-quoted for systemd (`%` doubled; `$VAR` left to systemd)."""
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"'


def exec_start_with_draft(
    command: ExecCommand, checkpoint_dir: str, num_speculative_tokens: int, enforce_eager: bool
) -> str:
    """The ExecStart value that runs `command` with the draft; its prefixes and `$VAR`s are kept.

    Raises:
        ServeCheckError: the command is not a vLLM server, or wraps it in a shell (`bash -c "..."`),
            where added flags would land outside the vLLM command.
    """
    words = split_words(command.raw, "ExecStart=")
    found = find_vllm(words)
    if found is None:
        raise ServeCheckError(
            f"ExecStart runs {words[:1]}, not vLLM: add the draft to the server yourself (a second unit) "
            "and set validate.serve_check: false"
        )
    if any(posixpath.basename(w) in SHELLS for w in found[0]):
        raise ServeCheckError(
            "ExecStart wraps vLLM in a shell -c string: serve the draft through a second unit"
        )
    served = with_speculative_draft(
        words, checkpoint_dir, num_speculative_tokens, enforce_eager=enforce_eager
    )
    return command.prefixes + " ".join(systemd_quote(w) for w in served)


def new_run_id() -> str:
    """The id written in the drop-in's marker: when, and a random part."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def dropin_text(exec_start: str, run_id: str = "", was_active: bool = True) -> str:
    """The drop-in: the marker line (run id, the unit's state before), then ExecStart reset and set."""
    return (
        f"{MARKER} run={run_id or new_run_id()} was_active={'yes' if was_active else 'no'}\n"
        "# Temporary (a runtime drop-in, gone on reboot); the next eagle3-pipeline run removes it if\n"
        "# this one died. Safe to delete: then `systemctl daemon-reload` and restart the unit.\n"
        f"[Service]\nExecStart=\nExecStart={exec_start}\n"
    )


def parse_marker(text: str) -> dict[str, Any] | None:
    """{'run', 'was_active'} from a drop-in of ours (was_active None for the legacy marker); None
    when the text is not ours."""
    match = _MARKER_LINE.match(text)
    if match:
        return {"run": match["run"], "was_active": match["was_active"] == "yes"}
    if text.startswith(_LEGACY_MARKER):
        return {"run": "legacy", "was_active": None}
    return None


def dropin_path(unit: str, unit_dir: str = UNIT_DIR) -> str:
    """Where our drop-in for unit goes.

    Raises:
        ServeCheckError: a unit name that would put it elsewhere (a `/`, or not a .service).
    """
    if "/" in unit or not unit.endswith(".service") or unit.startswith("."):
        raise ServeCheckError(f"server.unit {unit!r} is not a NAME.service unit name")
    return f"{unit_dir}/{unit}.d/{DROPIN_NAME}"


def _must(result: Any, what: str) -> Any:
    if not result.ok:
        raise ServeCheckError(
            f"{what} failed on the server host: {result.stderr.strip() or result.stdout.strip()}"
        )
    return result


def _retried(host: Any, command: str, what: str, timeout: float | None = None) -> str | None:
    """Run a restore step until it exits 0 (RESTORE_ATTEMPTS tries, reconnecting after SSH errors);
    None when it succeeded, else why it failed."""
    why = ""
    for attempt in range(1, RESTORE_ATTEMPTS + 1):
        try:
            res = host.run(command, timeout=timeout)
        except HostError as err:
            why = str(err)
            host.close()  # the next try reconnects
        else:
            if res.ok:
                return None
            why = f"exit {res.exited}: {(res.stderr or res.stdout).strip()}"
        log.warning("restore step %s failed (attempt %d/%d): %s", what, attempt, RESTORE_ATTEMPTS, why)
        if attempt < RESTORE_ATTEMPTS:
            time.sleep(RESTORE_RETRY_S)
    return why


def restore(
    host: Any, unit: str, path: str, was_active: bool, sudo: bool = True, timeout_s: float = 720,
    verify: Callable[[], None] | None = None,
) -> None:  # fmt: skip
    """Remove our drop-in, reload systemd, and put the unit back (restart if it was active, else stop);
    then `verify` that production serves again. Every step is checked and retried.

    Raises:
        ServeCheckError: a step still failed; the message lists what to run by hand.
    """
    prefix = "sudo -n " if sudo else ""
    q_unit, q_path = shlex.quote(unit), shlex.quote(path)
    action = "restart" if was_active else "stop"
    steps = [
        (f"{prefix}rm -f -- {q_path} && test ! -e {q_path}", f"removing {path}", None),
        (f"{prefix}systemctl daemon-reload", "systemctl daemon-reload", None),
        (f"{prefix}systemctl {action} -- {q_unit}", f"systemctl {action} {unit}", timeout_s),
    ]
    with deferred_interrupts() as received:
        for command, what, timeout in steps:
            why = _retried(host, command, what, timeout)
            if why is not None:
                manual = " && ".join(f"sudo {c.removeprefix(prefix)}" for c, _, _ in steps)
                raise ServeCheckError(
                    f"restoring {unit} on {host.name} failed at {what} ({why}); production may still run "
                    f"the draft. Run by hand: {manual}"
                )
        log.info("serve check restore: %s removed, daemon-reload, %s %s", path, action, unit)
        if was_active and verify is not None:
            try:
                verify()
            except Exception as err:
                raise ServeCheckError(f"{unit} was restored but production is not back: {err}") from err
            log.info("production %s answers /health and serves its model again", unit)
    if received:
        raise Interrupted(received[0])


@contextlib.contextmanager
def draft_dropin(
    host: Any, unit: str, exec_start: str, sudo: bool = True, timeout_s: float = 720,
    unit_dir: str | None = None, before_restart: Callable[[], None] | None = None,
    verify: Callable[[], None] | None = None,
) -> Iterator[str]:  # fmt: skip
    """Install the drop-in (marker, run id) and restart the unit with the draft; on exit, whatever
    happened, `restore`. `before_restart` runs after the drop-in is written (the checkpoint's hash
    check); yields the run id."""
    prefix = "sudo -n " if sudo else ""
    q_unit = shlex.quote(unit)
    path = dropin_path(unit, unit_dir or UNIT_DIR)
    was_active = host.run(f"systemctl is-active --quiet -- {q_unit}").ok
    run_id = new_run_id()
    try:
        _must(
            host.run(f"{prefix}mkdir -p -- {shlex.quote(posixpath.dirname(path))}"),
            "mkdir of the drop-in folder",
        )
        text = dropin_text(exec_start, run_id, was_active)
        _must(secrets.write_secret_file(host, path, text, sudo), f"writing {path}")
        if before_restart is not None:
            before_restart()
        _must(host.run(f"{prefix}systemctl daemon-reload"), "systemctl daemon-reload")
        _must(
            host.run(f"{prefix}systemctl restart -- {q_unit}", timeout=timeout_s), f"systemctl restart {unit}"
        )
        yield run_id
    except BaseException as err:
        log.warning("serve check ends early (%s): restoring %s", type(err).__name__, unit)
        restore(host, unit, path, was_active, sudo, timeout_s, verify)
        raise
    else:
        restore(host, unit, path, was_active, sudo, timeout_s, verify)


def recover_leftover(
    host: Any, unit: str, sudo: bool = True, timeout_s: float = 720,
    unit_dirs: tuple[str, ...] | None = None, verify: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Find and restore a drop-in a previous serve check left behind (killed, connection lost).

    Returns:
        One {'path', 'run', 'was_active'} per drop-in restored (empty when none was found).

    Raises:
        ServeCheckError: a file at our path that we did not write, or the restore failed.
    """
    found = []
    for unit_dir in unit_dirs or RECOVERY_DIRS:
        path = dropin_path(unit, unit_dir)
        res = host.run(f"cat -- {shlex.quote(path)}")
        if not res.ok:
            if "No such file" not in res.stderr:
                raise ServeCheckError(f"cannot read {host.name}:{path}: {res.stderr.strip()}")
            continue
        marker = parse_marker(res.stdout)
        if marker is None:
            raise ServeCheckError(
                f"{host.name}:{path} exists but was not written by eagle3-pipeline (no '{MARKER}' line): "
                "it changes the unit the serve check would restore; move it away or rename it"
            )
        was_active = marker["was_active"]
        if was_active is None:  # legacy: the state before is unknown; keep the unit as it is now
            was_active = host.run(f"systemctl is-active --quiet -- {shlex.quote(unit)}").ok
        log.warning(
            "found the drop-in of an unfinished serve check (run %s) at %s:%s: restoring %s first",
            marker["run"], host.name, path, unit,
        )  # fmt: skip
        restore(host, unit, path, was_active, sudo, timeout_s, verify)
        found.append({"path": path, "run": marker["run"], "was_active": was_active})
    return found


def recover_leftover_dropin(server_cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """`recover_leftover` on the configured host; nothing to do where the pipeline runs the unit as a
    local process (no systemd). Called first by snapshot_server, so that a draft command left in the
    unit is never snapshotted as production."""
    from eagle3_pipeline.server.lifecycle import uses_local_process
    from eagle3_pipeline.server.remote import open_host

    if uses_local_process(server_cfg):
        return []
    host = open_host(server_cfg)
    try:
        return recover_leftover(
            host,
            server_cfg["unit"],
            bool(server_cfg.get("ssh", {}).get("sudo", SSH_DEFAULTS.sudo)),
            _restart_timeout(server_cfg),
        )
    finally:
        host.close()


def _start_timeout_s(server_cfg: dict[str, Any]) -> float:
    """server.start_timeout_s: how long production may take to answer /health again."""
    return float(server_cfg.get("start_timeout_s", SERVER_DEFAULTS.start_timeout_s))


def _restart_timeout(server_cfg: dict[str, Any]) -> float:
    """A blocking restart stops the old server first (minutes for a tensor-parallel one)."""
    return float(server_cfg.get("stop_timeout_s", SERVER_DEFAULTS.stop_timeout_s)) + 120


def vllm_exec(cat_text: str, unit: str) -> ExecCommand:
    """The unit's ExecStart line that runs vLLM (the last one naming vllm), after drop-ins."""
    from eagle3_pipeline.server.unit import merge_unit, split_cat_output

    parsed = merge_unit(split_cat_output(cat_text, default_path=unit), unit)
    candidates = [c for c in parsed.exec_start if "vllm" in c.raw] or parsed.exec_start[-1:]
    if not candidates:
        raise ServeCheckError(f"{unit} has no ExecStart= after its drop-ins: nothing to add the draft to")
    return candidates[-1]


def _production_check(
    server_cfg: dict[str, Any], server_json: dict[str, Any], state_dir: Path
) -> Callable[[], None]:
    """/health through the configured URL (tunnel included), then /v1/models lists the snapshot's model."""
    from eagle3_pipeline.server import auth_headers, tls_verify
    from eagle3_pipeline.server.lifecycle import check_model, server_url, wait_healthy

    def check() -> None:
        headers, verify = auth_headers(server_cfg), tls_verify(server_cfg)
        base_url = server_url(server_json, server_cfg, state_dir)
        wait_healthy(base_url, _start_timeout_s(server_cfg), None, None, headers, verify=verify)
        check_model(base_url, server_json["served_model_name"], headers, verify)

    return check


def run_remote_serve_check(
    server_cfg: dict[str, Any],
    server_json: dict[str, Any],
    checkpoint_dir: str | Path,
    questions: list[dict],
    sampling: Any,
    state_dir: str | Path,
    num_speculative_tokens: int,
    remote_dir: str | None,
    enforce_eager: bool = True,
    concurrency: int = 8,
    request_timeout_s: float = 600.0,
) -> dict[str, Any]:
    """The serve check through systemd (an SSH host, or this machine when it runs systemd)."""
    from eagle3_pipeline.server import api_key, auth_headers, tls_verify
    from eagle3_pipeline.server.lifecycle import UnitWatch, server_url, wait_healthy
    from eagle3_pipeline.server.remote import open_host
    from eagle3_pipeline.server.snapshot import read_unit_text
    from eagle3_pipeline.validate import remote_checkpoint
    from eagle3_pipeline.validate.serving import measure

    unit, sudo = server_cfg["unit"], bool(server_cfg.get("ssh", {}).get("sudo", SSH_DEFAULTS.sudo))
    timeout_s = _restart_timeout(server_cfg)
    verify = _production_check(server_cfg, server_json, Path(state_dir))
    with interrupts_as_exceptions():
        host = open_host(server_cfg)
        folder = None
        try:
            recover_leftover(host, unit, sudo, timeout_s, verify=verify)  # before anything else
            cat_text = read_unit_text(host, server_cfg)
            command = vllm_exec(cat_text, unit)
            expected = remote_checkpoint.sha256_files(checkpoint_dir)
            if host.is_local:
                checkpoint = str(Path(checkpoint_dir).resolve())
            else:
                sandbox = remote_checkpoint.unit_sandbox(cat_text, unit)
                folder = checkpoint = remote_checkpoint.private_dir(host, remote_dir, sandbox)
                remote_checkpoint.upload(host, checkpoint_dir, folder)
            exec_start = exec_start_with_draft(command, checkpoint, num_speculative_tokens, enforce_eager)
            with draft_dropin(
                host, unit, exec_start, sudo, timeout_s,
                before_restart=lambda: remote_checkpoint.verify(host, checkpoint, expected), verify=verify,
            ) as run_id:  # fmt: skip
                base_url = server_url(server_json, server_cfg, Path(state_dir))
                watch = UnitWatch(server_cfg)
                try:
                    wait_healthy(
                        base_url, _start_timeout_s(server_cfg), watch.journal, watch.alive,
                        auth_headers(server_cfg), lambda: f"{unit} with the draft stopped ({watch.state})",
                        tls_verify(server_cfg),
                    )  # fmt: skip
                finally:
                    watch.close()
                result = measure(
                    base_url, questions, sampling, api_key(server_cfg), concurrency, request_timeout_s,
                    ca_bundle=server_cfg.get("ca_bundle"),
                )  # fmt: skip
        finally:
            if folder is not None:
                remote_checkpoint.remove(host, folder)
            host.close()
    return result | {"mode": "systemd-dropin", "unit": unit, "host": server_cfg.get("host"), "run_id": run_id}
