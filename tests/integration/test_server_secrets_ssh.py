"""Text holding secrets (the serve check's drop-in with an inline `--api-key`) reaches a host through
the command's stdin over the real sshd on 127.0.0.1: the command line the host runs never holds it."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from eagle3_pipeline.server.remote import RemoteHost, write_secret_file
from eagle3_pipeline.settings import ServerSettings, section

pytestmark = pytest.mark.ssh
SECRET = "zq91-inline-api-key"


@pytest.fixture
def recording_sudo(sshd_server, tmp_path: Path):
    """A `sudo` first on the remote PATH that records its argv, then runs the command (test data)."""
    argv_log = tmp_path / "sudo-argv.log"
    target = sshd_server.bin_dir / "sudo"
    target.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {argv_log}\n[ "$1" = -n ] && shift\nexec "$@"\n')
    target.chmod(0o755)
    yield argv_log
    target.unlink()


def test_secret_file_is_written_through_stdin_over_ssh(sshd_server, recording_sudo: Path, tmp_path: Path):
    cfg = section(ServerSettings, sshd_server.server_cfg())
    host = RemoteHost(cfg.host, cfg.ssh, str(sshd_server.ssh_config))
    path = tmp_path / "vllm.service.d" / "zz-eagle3-serve-check.conf"
    path.parent.mkdir()
    text = f"[Service]\nExecStart=\nExecStart=/x/vllm serve m --api-key {SECRET}\n"
    try:
        result = write_secret_file(host, str(path), text, sudo=True)
    finally:
        host.close()
    assert result.ok, result.stderr
    assert path.read_text() == text and stat.S_IMODE(path.stat().st_mode) == 0o600
    recorded = recording_sudo.read_text()
    assert str(path) in recorded and SECRET not in recorded
