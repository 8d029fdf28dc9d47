"""The serve check in production: the same systemd unit, restarted with the draft, then restored.

On the GPU box the target occupies every GPU, so the draft cannot be served beside it: the check
writes a temporary drop-in `/etc/systemd/system/UNIT.d/zz-eagle3-serve-check.conf` that resets
ExecStart and sets it to the unit's own command plus `--speculative-config` (and `--enforce-eager`
when configured), copies the checkpoint to the host, runs `daemon-reload` and `restart`, measures,
and in every case removes the drop-in, reloads, and puts the unit back as it was (restarted when it
was active, stopped when it was not). `zz-` sorts last, so the drop-in wins over the unit's own.

Needs on the host: `sudo -n` for systemctl, tee and rm (server.ssh.sudo), and a checkpoint folder the
unit's User can read (validate.remote_dir; not under /tmp when the unit has PrivateTmp=).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import posixpath
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko

from eagle3_pipeline.server.unit import ExecCommand, split_words
from eagle3_pipeline.server.vllm_args import SHELLS, find_vllm
from eagle3_pipeline.validate.serve_check import ServeCheckError, with_speculative_draft

log = logging.getLogger(__name__)

DROPIN_NAME = "zz-eagle3-serve-check.conf"
UNIT_DIR = "/etc/systemd/system"
CHECKPOINT_FILES = ("config.json", "model.safetensors")


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


def dropin_text(exec_start: str) -> str:
    """The drop-in: reset ExecStart, then the command with the draft."""
    return (
        "# Written by eagle3-pipeline's serve_check; removed when the check ends. Safe to delete.\n"
        f"[Service]\nExecStart=\nExecStart={exec_start}\n"
    )


def checkpoint_digest(checkpoint_dir: str | Path) -> str:
    """A short content hash of the checkpoint: its folder name on the host."""
    digest = hashlib.blake2b(digest_size=8)
    for name in CHECKPOINT_FILES:
        with open(Path(checkpoint_dir) / name, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def _stream(host: Any, local: Path, remote: str) -> None:
    """Copy a file through an exec channel (`cat > tmp && mv`): for hosts without the SFTP subsystem."""
    tmp = remote + ".part"
    channel = host.connection.transport.open_session()
    try:
        channel.exec_command(f"cat > {shlex.quote(tmp)} && mv -- {shlex.quote(tmp)} {shlex.quote(remote)}")
        with open(local, "rb") as handle:
            while chunk := handle.read(1 << 20):
                channel.sendall(chunk)
        channel.shutdown_write()
        status = channel.recv_exit_status()
    finally:
        channel.close()
    if status != 0:
        raise ServeCheckError(f"copying {local} to {host.name}:{remote} failed (exit {status})")


def upload_checkpoint(host: Any, checkpoint_dir: str | Path, remote_dir: str) -> str:
    """Copy config.json and model.safetensors to remote_dir/<hash>/ on the host (SFTP, else a plain
    exec channel); returns that folder. A folder already holding both files is reused."""
    target = posixpath.join(remote_dir, checkpoint_digest(checkpoint_dir))
    names = " ".join(shlex.quote(posixpath.join(target, n)) for n in CHECKPOINT_FILES)
    if host.run(f"ls -- {names}").ok:
        return target
    _must(host.run(f"mkdir -p -- {shlex.quote(target)}"), f"mkdir {target}")
    host.open()
    for name in CHECKPOINT_FILES:
        local, remote = Path(checkpoint_dir) / name, posixpath.join(target, name)
        try:
            host.connection.put(str(local), remote + ".part")
            _must(host.run(f"mv -- {shlex.quote(remote + '.part')} {shlex.quote(remote)}"), f"mv {remote}")
        except paramiko.SSHException as err:
            log.info("SFTP unavailable on %s (%s): streaming %s", host.name, err, name)
            _stream(host, local, remote)
    return target


def _must(result: Any, what: str) -> Any:
    if not result.ok:
        raise ServeCheckError(
            f"{what} failed on the server host: {result.stderr.strip() or result.stdout.strip()}"
        )
    return result


@contextlib.contextmanager
def draft_dropin(
    host: Any, unit: str, text: str, sudo: bool = True, timeout_s: float = 120, unit_dir: str = UNIT_DIR
) -> Iterator[None]:
    """Install the drop-in and restart the unit; on exit remove it and restore the unit's state."""
    prefix = "sudo -n " if sudo else ""
    q_unit = shlex.quote(unit)
    path = f"{unit_dir}/{unit}.d/{DROPIN_NAME}"
    was_active = host.run(f"systemctl is-active --quiet -- {q_unit}").ok
    _must(
        host.run(f"{prefix}mkdir -p -- {shlex.quote(posixpath.dirname(path))}"), "mkdir of the drop-in folder"
    )
    _must(
        host.run(f"printf %s {shlex.quote(text)} | {prefix}tee -- {shlex.quote(path)} >/dev/null"),
        f"writing {path}",
    )
    try:
        _must(host.run(f"{prefix}systemctl daemon-reload"), "systemctl daemon-reload")
        _must(
            host.run(f"{prefix}systemctl restart -- {q_unit}", timeout=timeout_s), f"systemctl restart {unit}"
        )
        yield
    finally:
        host.run(f"{prefix}rm -f -- {shlex.quote(path)}")
        host.run(f"{prefix}systemctl daemon-reload")
        action = "restart" if was_active else "stop"
        log.info("serve check done: drop-in removed, %s %s", action, unit)
        host.run(f"{prefix}systemctl {action} -- {q_unit}", timeout=timeout_s)


def vllm_exec(cat_text: str, unit: str) -> ExecCommand:
    """The unit's ExecStart line that runs vLLM (the last one naming vllm), after drop-ins."""
    from eagle3_pipeline.server.unit import merge_unit, split_cat_output

    parsed = merge_unit(split_cat_output(cat_text, default_path=unit), unit)
    candidates = [c for c in parsed.exec_start if "vllm" in c.raw] or parsed.exec_start[-1:]
    if not candidates:
        raise ServeCheckError(f"{unit} has no ExecStart= after its drop-ins: nothing to add the draft to")
    return candidates[-1]


def run_remote_serve_check(
    server_cfg: dict[str, Any],
    server_json: dict[str, Any],
    checkpoint_dir: str | Path,
    questions: list[dict],
    sampling: Any,
    state_dir: str | Path,
    num_speculative_tokens: int,
    remote_dir: str,
    enforce_eager: bool = True,
    concurrency: int = 8,
    request_timeout_s: float = 600.0,
) -> dict[str, Any]:
    """The serve check through systemd (an SSH host, or this machine when it runs systemd)."""
    from eagle3_pipeline.server import api_key, auth_headers
    from eagle3_pipeline.server.lifecycle import server_url, wait_healthy
    from eagle3_pipeline.server.remote import open_host
    from eagle3_pipeline.server.snapshot import read_unit_text
    from eagle3_pipeline.validate.serve_check import measure

    host = open_host(server_cfg)
    try:
        command = vllm_exec(read_unit_text(host, server_cfg), server_cfg["unit"])
        checkpoint = (
            upload_checkpoint(host, checkpoint_dir, remote_dir) if not host.is_local else str(checkpoint_dir)
        )
        text = dropin_text(exec_start_with_draft(command, checkpoint, num_speculative_tokens, enforce_eager))
        sudo = bool(server_cfg.get("ssh", {}).get("sudo", True))
        with draft_dropin(host, server_cfg["unit"], text, sudo=sudo):
            base_url = server_url(server_json, server_cfg, Path(state_dir))
            wait_healthy(
                base_url, float(server_cfg.get("start_timeout_s", 1800)), None, None, auth_headers(server_cfg)
            )
            result = measure(
                base_url, questions, sampling, api_key(server_cfg), concurrency, request_timeout_s
            )
    finally:
        host.close()
    return result | {"mode": "systemd-dropin", "unit": server_cfg["unit"], "host": server_cfg.get("host")}
