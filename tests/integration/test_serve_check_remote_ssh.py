"""The production serve check's host side end to end, over a real sshd: the checkpoint in a private
folder with its content checked before the check unit starts, then `run_remote_serve_check` with the
systemd stand-in (tests/data/remote/systemctl-unit): production read with `systemctl cat`, the draft
served by the check unit, production back by systemd's ExecStopPost; and the snapshot step finishing
what a killed check left.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from support.standin_systemd import UNIT
from support.standin_systemd import box as box  # noqa: F401 (fixtures)
from support.standin_systemd import fast_polls as fast_polls  # noqa: F401
from support.standin_systemd import host as host  # noqa: F401

from eagle3_pipeline.server import host_record, process_identity
from eagle3_pipeline.settings import ServerSettings, ValidateSettings, section
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


def test_the_snapshot_step_finishes_a_killed_check_first(sshd_server, host, box, tmp_path, monkeypatch):
    """scripts/snapshot_server.py calls recover_leftover_dropin before reading the unit: a record whose
    owner is provably gone (same host, boot and PID namespace; its process gone) is finished."""
    _home(sshd_server, tmp_path, monkeypatch)
    assert host.run(f"systemctl start -- {UNIT}").ok
    record = {"unit": UNIT, "run": "killed", "phase": "running", "was_active": True, "draft_path": "/srv/d-x",
              "check_unit": "eagle3-serve-check-killed.service", "invocation_before": box.invocation(),
              "env_file": None, "owner": process_identity.identity() | {"start_ticks": -1}}  # fmt: skip
    box.record.write_text(json.dumps(record))
    server = section(ServerSettings, sshd_server.server_cfg(host_state_dir=str(box.records)))
    found = host_record.recover_leftover_dropin(server)
    assert [f["run"] for f in found] == ["killed"] and not box.record.exists()
    assert box.mainpid_alive() and len(box.starts()) == 1  # running: nothing to start


def test_a_whole_remote_check_that_fails_leaves_production_as_it_was(sshd_server, host, box, tmp_path,
                                                                      monkeypatch):  # fmt: skip
    """run_remote_serve_check on the host side: the checkpoint copied to a private folder, the check
    unit started with the draft; the stand-in server has no /metrics, so the measurement fails;
    production is back (by systemd), verified, and the checkpoint folder removed. (The measurement
    itself is tested against real vLLM in test_serve_check.py.)"""
    from eagle3_pipeline.generate.client import Sampling
    from eagle3_pipeline.validate.production_check import run_remote_serve_check

    _home(sshd_server, tmp_path, monkeypatch)
    unit_text = (box.units / UNIT).read_text().replace("User=vllm\n", "")  # runs as the SSH user
    (box.units / UNIT).write_text(unit_text)
    assert host.run(f"systemctl start -- {UNIT}").ok
    files = box.unit_files()
    base = tmp_path / "remote-base"
    server = section(ServerSettings, sshd_server.server_cfg(
        base_url=f"http://127.0.0.1:{box.port}", start_timeout_s=30, api_key_env="E3_NO_KEY",
        host_state_dir=str(box.records),
    ))  # fmt: skip
    validate = ValidateSettings(num_speculative_tokens=3, remote_dir=str(base), enforce_eager=False)
    server_json = {"served_model_name": "kimi-k2", "port": box.port, "base_url": server.base_url}
    with pytest.raises(Exception, match="metrics"):
        run_remote_serve_check(
            server, validate, server_json, checkpoint(tmp_path / "ckpt"),
            [{"id": "q", "system": None, "question": "hi"}], Sampling("kimi-k2", 8, 0.0, 1.0, None),
            tmp_path / "work",
        )  # fmt: skip
    (check,) = box.check_units()
    ran = [c for c in box.calls() if c.startswith("systemd-run")][0]
    assert "--speculative-config" in ran and str(base) in ran  # the draft from its private folder
    deadline = time.monotonic() + 10
    while not box.mainpid_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert box.unit_files() == files and len(box.starts()) == 2 and box.mainpid_alive()
    assert not any("daemon-reload" in c for c in box.calls()) and list(base.iterdir()) == []
    assert not box.record.exists() and os.path.basename(str(check)).startswith("eagle3-serve-check-")
