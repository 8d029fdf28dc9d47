"""The draft checkpoint on the server host, for the production serve check: a fresh private folder,
a copy, and its content checked before the unit loads it.

Why private: the check unit usually runs as root and loads whatever weights sit at the path its
command names. A predictable path in a shared folder (the old `/var/tmp/eagle3-pipeline/<hash>/`, reused when
present) lets any local user plant or swap those weights. Here every run gets its own `mktemp -d`
folder (mode 0700, owned by the SSH user) under a base folder that nobody else can write to
(`validate.remote_dir`, default `~/.cache/eagle3-pipeline/serve-check` in the SSH user's home), the
files are copied into it, and their sha256 is compared with the local files on the host right before
the check unit starts. The folder is removed after production is restored.

Why the unit can read it: a root service (no `User=`) reads any folder. A unit with `User=` other
than root and the SSH user cannot read a 0700 folder of the SSH user: that is refused with a message
(run the check as that user, or serve the draft through a second unit). `PrivateTmp=` hides the host's
/tmp and /var/tmp from the unit and `ProtectHome=yes|tmpfs` hides /home, /root and /run/user: a base
folder there is refused for such a unit, naming validate.remote_dir.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from eagle3_pipeline.server.draft_command import ServeCheckError
from eagle3_pipeline.server.unit import merge_unit, parse_unit_file, split_cat_output

log = logging.getLogger(__name__)

CHECKPOINT_FILES = ("config.json", "model.safetensors")
DEFAULT_BASE = "~/.cache/eagle3-pipeline/serve-check"


class CheckpointError(ServeCheckError):
    """The checkpoint cannot be placed safely on the host; the message says what to change."""


@dataclass
class UnitSandbox:
    """The unit settings that decide which host paths the service can read."""

    user: str | None = None
    private_tmp: bool = False
    protect_home: str = "no"


def unit_sandbox(cat_text: str, unit: str) -> UnitSandbox:
    """User=, PrivateTmp= and ProtectHome= of the unit after its drop-ins (last assignment wins)."""
    files = split_cat_output(cat_text, default_path=unit)
    sandbox = UnitSandbox(user=merge_unit(files, unit).user)
    for path, text in files:
        for section, key, value in parse_unit_file(path, text).assignments:
            if section != "Service":
                continue
            if key == "PrivateTmp":
                sandbox.private_tmp = value.strip().lower() in ("yes", "true", "on", "1", "disconnected")
            elif key == "ProtectHome":
                sandbox.protect_home = value.strip().lower() or "no"
    return sandbox


def sha256_files(checkpoint_dir: str | Path) -> dict[str, str]:
    """sha256 of each checkpoint file: what must arrive on the host, byte for byte."""
    digests = {}
    for name in CHECKPOINT_FILES:
        digest = hashlib.sha256()
        with open(Path(checkpoint_dir) / name, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        digests[name] = digest.hexdigest()
    return digests


def _run(host: Any, command: str, what: str) -> str:
    res = host.run(command)
    if not res.ok:
        raise CheckpointError(f"{what} failed on {host.name}: {(res.stderr or res.stdout).strip()}")
    return res.stdout


def _hidden_from_unit(path: str, sandbox: UnitSandbox) -> str | None:
    """Why the unit would not see path (PrivateTmp=, ProtectHome=), or None."""
    parts = posixpath.normpath(path)
    if sandbox.private_tmp and any(parts == d or parts.startswith(d + "/") for d in ("/tmp", "/var/tmp")):
        return "the unit has PrivateTmp=, so it sees its own /tmp and /var/tmp, not this folder"
    hidden_homes = ("/home", "/root", "/run/user")
    if sandbox.protect_home in ("yes", "true", "tmpfs") and any(
        parts == d or parts.startswith(d + "/") for d in hidden_homes
    ):
        return f"the unit has ProtectHome={sandbox.protect_home}, which hides /home, /root and /run/user"
    return None


def private_dir(host: Any, base: str | None, sandbox: UnitSandbox) -> str:
    """A new folder `BASE/run.XXXXXXXX` (mktemp -d: mode 0700, owned by the SSH user) on the host.

    Raises:
        CheckpointError: the unit could not read it, or BASE is writable by others (they could swap
            the folder), or the folder did not come out private.
    """
    login = _run(host, 'id -un; id -u; printf %s "$HOME"', "id").split("\n", 2)
    user, uid, home = login[0], login[1], login[2] if len(login) > 2 else ""
    if sandbox.user not in (None, "root", "0", user):
        raise CheckpointError(
            f"the unit runs as User={sandbox.user}, which cannot read a private folder of the SSH user "
            f"{user}: connect as {sandbox.user} (server.host) or serve the draft through a second unit "
            "and set validate.serve_check: false"
        )
    base = base or DEFAULT_BASE
    if base == "~" or base.startswith("~/"):
        base = home + base[1:]
    if not base.startswith("/"):
        raise CheckpointError(f"validate.remote_dir must be absolute or start with ~/: {base!r}")
    why = _hidden_from_unit(base, sandbox)
    if why:
        raise CheckpointError(f"{base}: {why}; set validate.remote_dir to a folder the unit can see")
    q_base = shlex.quote(base)
    folder = _run(
        host, f"umask 077 && mkdir -p -- {q_base} && mktemp -d -- {q_base}/run.XXXXXXXX", "mktemp -d"
    ).strip()
    owner, mode = _run(host, f"stat -c '%u %a' -- {q_base} {shlex.quote(folder)}", "stat").split("\n")[:2]
    base_uid, base_mode = owner.split()
    if base_uid not in (uid, "0") or (int(base_mode, 8) & 0o022 and not int(base_mode, 8) & 0o1000):
        host.run(f"rm -rf -- {shlex.quote(folder)}")
        raise CheckpointError(
            f"{base} is owned by uid {base_uid} with mode {base_mode}: another user could replace the "
            "checkpoint folder inside it; use a validate.remote_dir owned by the SSH user and not "
            "writable by others"
        )
    if mode.split() != [uid, "700"]:
        raise CheckpointError(f"{folder} came out as {mode!r}, not 'uid {uid} mode 700'")
    return folder


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
        raise CheckpointError(f"copying {local} to {host.name}:{remote} failed (exit {status})")


def upload(host: Any, checkpoint_dir: str | Path, folder: str) -> None:
    """Copy config.json and model.safetensors into folder (SFTP, else a plain exec channel)."""
    host.open()
    for name in CHECKPOINT_FILES:
        local, remote = Path(checkpoint_dir) / name, posixpath.join(folder, name)
        try:
            host.connection.put(str(local), remote + ".part")
            _run(host, f"mv -- {shlex.quote(remote + '.part')} {shlex.quote(remote)}", f"mv {remote}")
        except paramiko.SSHException as err:
            log.info("SFTP unavailable on %s (%s): streaming %s", host.name, err, name)
            _stream(host, local, remote)


def verify(host: Any, folder: str, expected: dict[str, str]) -> None:
    """Compare the sha256 of the files in folder on the host with the local ones.

    Raises:
        CheckpointError: a file differs or is missing (nothing is installed then).
    """
    names = " ".join(shlex.quote(posixpath.join(folder, n)) for n in expected)
    found = {}
    for line in _run(host, f"sha256sum -- {names}", "sha256sum of the checkpoint").splitlines():
        digest, _, path = line.partition("  ")
        found[posixpath.basename(path)] = digest
    wrong = sorted(n for n, digest in expected.items() if found.get(n) != digest)
    if wrong:
        raise CheckpointError(
            f"{host.name}:{folder}: {', '.join(wrong)} differ from the exported checkpoint; not loading them"
        )


def remove(host: Any, folder: str) -> None:
    """Remove the run's folder (after the unit is restored); a failure is logged, never raised."""
    res = host.run(f"rm -rf -- {shlex.quote(folder)}")
    if not res.ok:
        log.warning("could not remove %s:%s: %s", host.name, folder, res.stderr.strip())
