"""The production serve check's host side over a real sshd: the checkpoint copied by SFTP, the drop-in
written, the unit restarted with the draft, and afterwards the drop-in removed and the unit put back as
it was. systemctl is a recording stand-in (tests/data/validate/remote/systemctl): no systemd here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_pipeline.server.remote import RemoteHost
from eagle3_pipeline.server.unit import ExecCommand
from eagle3_pipeline.validate.dropin import (
    DROPIN_NAME,
    checkpoint_digest,
    draft_dropin,
    dropin_text,
    exec_start_with_draft,
    upload_checkpoint,
)

pytestmark = pytest.mark.ssh
DATA = Path(__file__).resolve().parents[1] / "data" / "validate"


@pytest.fixture
def recording_systemctl(sshd_server, tmp_path):
    log, state, units = tmp_path / "systemctl.log", tmp_path / "state", tmp_path / "etc"
    units.mkdir()
    script = (DATA / "remote" / "systemctl").read_text()
    target = sshd_server.bin_dir / "systemctl"
    target.write_text(
        script.replace("@LOG@", str(log)).replace("@STATE@", str(state)).replace("@UNITS@", str(units))
    )
    target.chmod(0o755)
    yield log, state, units
    target.unlink()


@pytest.fixture
def host(sshd_server):
    remote = RemoteHost("vllm-box", sshd_server.server_cfg()["ssh"], str(sshd_server.ssh_config))
    yield remote
    remote.close()


def checkpoint(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    (path / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    return path


@pytest.mark.parametrize("was_active", [True, False])
def test_dropin_lifecycle(host, recording_systemctl, tmp_path, was_active):
    log, state, units = recording_systemctl
    state.write_text("active" if was_active else "inactive")
    local = checkpoint(tmp_path / "ckpt")
    remote = upload_checkpoint(host, local, str(tmp_path / "remote"))
    assert Path(remote).name == checkpoint_digest(local)
    for name in ("config.json", "model.safetensors"):
        assert (Path(remote) / name).read_bytes() == (local / name).read_bytes()

    command = ExecCommand("", '/usr/bin/vllm serve /models/kimi --port 8000 --served-model-name "kimi k2"')
    text = dropin_text(exec_start_with_draft(command, remote, 3, enforce_eager=False))
    dropin = units / "vllm.service.d" / DROPIN_NAME
    with draft_dropin(host, "vllm.service", text, sudo=False, unit_dir=str(units)):
        assert dropin.read_text() == text  # written byte for byte through the shell
    assert not dropin.exists()

    calls = log.read_text().splitlines()
    final = "restart -- vllm.service" if was_active else "stop -- vllm.service"
    assert calls[0] == "is-active --quiet -- vllm.service"
    assert calls[1:3] == ["daemon-reload", "restart -- vllm.service"]
    assert calls[3].startswith("ExecStart=") and remote in calls[3] and '"kimi k2"' in calls[3]
    assert calls[4:] == ["daemon-reload", final]
    assert state.read_text().strip() == ("active" if was_active else "inactive")


def test_dropin_removed_when_the_check_fails(host, recording_systemctl):
    _, state, units = recording_systemctl
    state.write_text("active")
    with (
        pytest.raises(RuntimeError, match="measurement failed"),
        draft_dropin(
            host, "vllm.service", dropin_text("/usr/bin/vllm serve /m"), sudo=False, unit_dir=str(units)
        ),
    ):
        raise RuntimeError("measurement failed")
    assert not (units / "vllm.service.d" / DROPIN_NAME).exists()
