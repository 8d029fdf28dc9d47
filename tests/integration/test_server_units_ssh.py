"""Unit classes read over the real sshd on 127.0.0.1 (issue 35, item 4): EnvironmentFile= globs
expanded on the host, a multi-line env value, `WorkingDirectory=~` from the host's user database, a
relative `--config`, a `bash -c ... "$@"` launcher, and secret shapes kept out of every output."""

from __future__ import annotations

import getpass
import pwd
from pathlib import Path

import pytest

from eagle3_pipeline.server.snapshot import snapshot_server
from eagle3_pipeline.settings import ServerSettings, section

pytestmark = pytest.mark.ssh
SECRETS = ("k1-over-ssh-61", "k2-over-ssh-62", "pr0xy-ssh-63", "hf-two-ssh-64")


def _snapshot(sshd_server, cfg: dict, out: Path) -> dict:
    return snapshot_server(
        section(ServerSettings, cfg),
        unit_out=str(out / "unit.service"),
        server_out=str(out / "server.json"),
        identity_out=str(out / "identity.json"),
        ssh_config_path=str(sshd_server.ssh_config),
    )


def test_unit_classes_over_ssh(sshd_server, tmp_path: Path) -> None:
    env_dir = tmp_path / "env.d"
    env_dir.mkdir()
    (env_dir / "10-base.env").write_text('PORT=1\nTEMPLATE="{{ messages }}\n{{ eos }}"\n')
    (env_dir / "20-override.env").write_text(f"PORT=18561\nHF_TOKEN2={SECRETS[3]}\n")
    unit = tmp_path / "vllm.service"
    user = getpass.getuser()
    home = Path(pwd.getpwnam(user).pw_dir)
    config = home / f".eagle3-units-ssh-{tmp_path.name}.yaml"
    config.write_text("tensor-parallel-size: 2\nserved-model-name: ssh-model\n")
    try:
        unit.write_text(
            "[Service]\n"
            f"User={user}\nWorkingDirectory=~\n"
            f"EnvironmentFile={env_dir}/*.env\nEnvironmentFile=-{tmp_path}/none/*.env\n"
            f"Environment=HTTPS_PROXY=http://u:{SECRETS[2]}@proxy:3128\n"
            "ExecStart=@/bin/bash launcher -c 'exec vllm serve \"$@\" --port ${PORT}' name /m "
            f"--config {config.name} --chat-template ${{TEMPLATE}} --api-key {SECRETS[0]} {SECRETS[1]}\n"
        )
        server = _snapshot(sshd_server, sshd_server.server_cfg(unit_file=str(unit)), tmp_path / "out")
    finally:
        config.unlink()
    assert (server["model"], server["port"], server["tensor_parallel_size"]) == ("/m", 18561, 2)
    assert server["served_model_name"] == "ssh-model"
    assert server["chat_template"] == "{{ messages }}\n{{ eos }}"
    assert server["unresolved"] == []
    for path in (tmp_path / "out").iterdir():
        text = path.read_text()
        for secret in SECRETS:
            assert secret not in text, f"{secret} leaked into {path.name}"
