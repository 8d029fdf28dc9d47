"""The production serve check's checkpoint on the host, over a real sshd: a private folder with its
content checked before the check unit starts, and folders the unit cannot see or others could swap
refused. (`run_remote_serve_check` end to end and the snapshot step finishing a killed check run on a
real systemd: test_serve_check_real_systemd.py.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.standin_systemd import box as box  # noqa: F401 (fixtures)
from support.standin_systemd import fast_polls as fast_polls  # noqa: F401
from support.standin_systemd import host as host  # noqa: F401

from eagle3_pipeline.validate import remote_checkpoint
from eagle3_pipeline.validate.remote_checkpoint import CheckpointError, UnitSandbox

pytestmark = pytest.mark.ssh


def checkpoint(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    (path / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    return path


def _home(sshd_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(sshd_server.ssh_config.read_text())
    monkeypatch.setenv("HOME", str(home))  # fabric reads ~/.ssh/config, as in production


def test_checkpoint_goes_to_a_private_folder_with_its_hash_checked(host, tmp_path):
    local = checkpoint(tmp_path / "ckpt")
    base = tmp_path / "remote-base"
    folder = remote_checkpoint.private_dir(host, str(base), UnitSandbox())
    assert Path(folder).parent == base and oct(os.stat(folder).st_mode & 0o777) == "0o700"
    assert os.stat(folder).st_uid == os.getuid()
    remote_checkpoint.upload(host, local, folder)
    expected = remote_checkpoint.sha256_files(local)
    remote_checkpoint.verify(host, folder, expected)
    assert remote_checkpoint.private_dir(host, str(base), UnitSandbox()) != folder  # never reused
    (Path(folder) / "model.safetensors").write_bytes(b"swapped weights")
    with pytest.raises(CheckpointError, match="model.safetensors differ"):
        remote_checkpoint.verify(host, folder, expected)
    remote_checkpoint.remove(host, folder)
    assert not Path(folder).exists()


def test_a_checkpoint_folder_the_unit_cannot_see_or_others_can_swap_is_refused(host, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by everyone, no sticky bit
    with pytest.raises(CheckpointError, match="another user could replace"):
        remote_checkpoint.private_dir(host, str(shared), UnitSandbox())
    assert list(shared.iterdir()) == []  # the folder it made was removed
    with pytest.raises(CheckpointError, match="PrivateTmp="):
        remote_checkpoint.private_dir(host, "/var/tmp/eagle3", UnitSandbox(private_tmp=True))
    with pytest.raises(CheckpointError, match="ProtectHome=yes"):
        remote_checkpoint.private_dir(host, "~/.cache/e3", UnitSandbox(protect_home="yes"))
    with pytest.raises(CheckpointError, match="User=vllm"):
        remote_checkpoint.private_dir(host, str(tmp_path / "b"), UnitSandbox(user="vllm"))
