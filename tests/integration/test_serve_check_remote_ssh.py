"""The production serve check's host side over a real sshd: the checkpoint in a private folder with its
content checked, a runtime drop-in written inside the guarded block (text on stdin), the unit
restarted with the draft, and afterwards the drop-in removed, every step checked and retried, the
unit put back as it was and production verified; SIGTERM, and a leftover drop-in of a killed run.

systemctl and journalctl on the remote are tests/data/remote/systemctl-unit: a real shell script with
a real process behind it (a small HTTP server answering /health and /v1/models). It stands for
systemctl's command-line contract only (exit codes, is-active, the order of calls); systemd's own
drop-in loading, Type=/Restart= semantics and sudo rules are not exercised here. The "unit folders"
are folders under tmp_path: the real /run/systemd/system is never written by the tests.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from support.sshd import StandInUnit, kill_stand_in_unit

from eagle3_pipeline.ports import free_port
from eagle3_pipeline.server import host_record
from eagle3_pipeline.server.dropin import (
    DROPIN_NAME,
    ServeCheckError,
    dropin_text,
    exec_start_with_draft,
    parse_marker,
)
from eagle3_pipeline.server.host_record import draft_dropin, recover_leftover
from eagle3_pipeline.server.interrupts import Interrupted, interrupts_as_exceptions
from eagle3_pipeline.server.remote import RemoteHost
from eagle3_pipeline.server.unit import ExecCommand
from eagle3_pipeline.settings import ServerSettings, SshSettings, ValidateSettings, section
from eagle3_pipeline.validate import remote_checkpoint
from eagle3_pipeline.validate.remote_checkpoint import CheckpointError, UnitSandbox

pytestmark = pytest.mark.ssh
DATA = Path(__file__).resolve().parents[1] / "data"
UNIT = "vllm.service"
COMMAND = ExecCommand("", '/usr/bin/vllm serve /models/kimi --port 8000 --served-model-name "kimi k2"')


class Unit(StandInUnit):
    """The stand-in's state (calls, process) and the runtime/legacy unit folders."""

    def __init__(self, state: Path, units: Path, legacy: Path, port: int) -> None:
        self.state, self.units, self.legacy, self.port = state, units, legacy, port

    @property
    def dropin(self) -> Path:
        return self.units / f"{UNIT}.d" / DROPIN_NAME

    def systemctl_calls(self) -> list[str]:
        """The calls that act (reads such as `show` and `is-active` left out)."""
        return [
            c.removeprefix("systemctl ")
            for c in self.calls()
            if c.startswith(("systemctl", "loaded")) and not c.startswith(("systemctl show", "systemctl is-"))
        ]

    @property
    def records(self) -> str:
        """server.host_state_dir: where the host record goes."""
        return str(self.units.parent / "run-eagle3")

    @property
    def record(self) -> Path:
        return Path(self.records) / f"{UNIT}.serve-check.json"

    def fail_next(self, action: str, times: int) -> None:
        (self.state / f"fail-{action}").write_text(str(times))


@pytest.fixture
def unit(sshd_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    state, units, legacy, served = (tmp_path / n for n in ("state", "run-units", "etc-units", "served"))
    for folder in (state, units, legacy, served / "v1"):
        folder.mkdir(parents=True)
    (served / "health").write_text("")
    (served / "v1" / "models").write_text(json.dumps({"data": [{"id": "kimi-k2"}]}))
    port = free_port()
    (state / "exec").write_text(
        f"#!/bin/sh\nexec {sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {served}\n"
    )
    (state / "exec").chmod(0o755)
    script = (DATA / "remote" / "systemctl-unit").read_text()
    script = script.replace("@STATE@", str(state)).replace("@UNITS@", str(units))
    for name in ("systemctl", "journalctl"):
        (sshd_server.bin_dir / name).write_text(script)
        (sshd_server.bin_dir / name).chmod(0o755)
    monkeypatch.setattr(host_record, "RESTORE_RETRY_S", 0.1)
    monkeypatch.setattr(host_record, "POLL_S", 0.1)
    fake = Unit(state, units, legacy, port)
    yield fake
    kill_stand_in_unit(state)
    for name in ("systemctl", "journalctl"):
        (sshd_server.bin_dir / name).unlink()


@pytest.fixture
def host(sshd_server):
    remote = RemoteHost(
        "vllm-box", section(SshSettings, sshd_server.server_cfg()["ssh"]), str(sshd_server.ssh_config)
    )
    yield remote
    remote.close()


def _start(host: RemoteHost) -> None:
    assert host.run(f"systemctl start -- {UNIT}").ok


def checkpoint(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    (path / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    return path


def _dropin(host, unit: Unit, **kwargs):
    exec_start = exec_start_with_draft(COMMAND, "/ckpt", 3, False)
    return draft_dropin(host, UNIT, exec_start, record_dir=unit.records, sudo=False, unit_dir=str(unit.units),
                        **kwargs)  # fmt: skip


@pytest.mark.parametrize("was_active", [True, False])
def test_dropin_lifecycle(host, unit, was_active):
    if was_active:
        _start(host)
    check = unit.production_check()
    with _dropin(host, unit, verify=check) as run_id:
        text = unit.dropin.read_text()  # written byte for byte through stdin
        assert text.startswith(
            f"# eagle3-pipeline serve_check run={run_id} was_active={'yes' if was_active else 'no'}"
        )
        assert parse_marker(text) == {"run": run_id, "was_active": was_active}
    assert not unit.dropin.exists()
    calls = unit.systemctl_calls()
    final = f"restart --no-block -- {UNIT}" if was_active else f"stop -- {UNIT}"
    i = calls.index("daemon-reload")
    assert calls[i + 1].startswith('loaded: ExecStart="/usr/bin/vllm"')
    assert calls[i + 2] == f"restart -- {UNIT}"
    assert calls[i + 3 :] == ["daemon-reload", final]  # the reload after removal saw no drop-in
    assert not unit.record.exists()  # the host record, removed last
    assert unit.mainpid_alive() == was_active


def test_restore_when_the_check_fails(host, unit):
    _start(host)
    with pytest.raises(RuntimeError, match="measurement failed"), _dropin(host, unit):
        raise RuntimeError("measurement failed")
    assert not unit.dropin.exists() and unit.mainpid_alive()


def test_restore_when_writing_the_dropin_fails_midway(host, unit):
    """Restart with the draft fails after the drop-in was written: the drop-in is still removed."""
    _start(host)
    unit.fail_next("restart", 1)
    with pytest.raises(ServeCheckError, match="systemctl restart"), _dropin(host, unit):
        pass
    assert not unit.dropin.exists()
    assert unit.systemctl_calls()[-2:] == ["daemon-reload", f"restart --no-block -- {UNIT}"]
    assert unit.mainpid_alive()


def test_restore_steps_are_retried(host, unit):
    _start(host)
    unit.fail_next("daemon-reload", 3)  # the write's reload and the restore's first two tries
    with pytest.raises(ServeCheckError, match="daemon-reload"), _dropin(host, unit):
        pass
    unit.fail_next("daemon-reload", 0)
    with _dropin(host, unit):
        unit.fail_next("daemon-reload", 2)  # the restore's reload fails twice, then works
    assert not unit.dropin.exists()
    assert unit.systemctl_calls()[-4:] == [
        "daemon-reload",
        "daemon-reload",
        "daemon-reload",
        f"restart --no-block -- {UNIT}",
    ]


def test_a_restore_that_keeps_failing_says_what_to_run(host, unit):
    _start(host)
    with pytest.raises(ServeCheckError) as info, _dropin(host, unit):
        unit.fail_next("restart", 5)
    message = str(info.value)
    assert f"failed at starting {UNIT}" in message and "production may still run the draft" in message
    assert f"sudo rm -f -- {unit.dropin}" in message and "sudo systemctl daemon-reload" in message
    assert unit.systemctl_calls()[-3:] == [f"restart --no-block -- {UNIT}"] * 3  # checked, retried 3 times
    assert unit.record.exists()  # kept: the next run resumes the restore


def test_production_identity_is_verified_after_the_restore(host, unit):
    _start(host)
    check = unit.production_check("other-model")
    with (
        pytest.raises(ServeCheckError, match="production is not back.*not 'other-model'"),
        _dropin(host, unit, verify=check),
    ):
        pass


def test_sigterm_during_the_check_restores_production(host, unit):
    _start(host)
    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or what an earlier in-process snakemake set
    with pytest.raises(Interrupted, match="SIGTERM"), interrupts_as_exceptions(), _dropin(host, unit):
        os.kill(os.getpid(), signal.SIGTERM)  # a SLURM cancel mid-measurement
        time.sleep(30)
    assert not unit.dropin.exists() and unit.mainpid_alive()
    assert unit.systemctl_calls()[-2:] == ["daemon-reload", f"restart --no-block -- {UNIT}"]
    assert signal.getsignal(signal.SIGTERM) is before  # handlers put back


def test_a_leftover_dropin_is_restored_first(host, unit):
    """A run killed by SIGKILL left its drop-in with production running the draft."""
    _start(host)
    unit.dropin.parent.mkdir()
    unit.dropin.write_text(dropin_text('"/usr/bin/vllm" "serve" "--speculative-config" "{}"', "r1", True))
    found = recover_leftover(host, UNIT, record_dir=unit.records, sudo=False,
                             unit_dirs=(str(unit.units), str(unit.legacy)),
                             verify=unit.production_check())  # fmt: skip
    assert found == [{"path": str(unit.dropin), "run": "r1", "was_active": True}]
    assert not unit.dropin.exists() and unit.mainpid_alive()
    assert unit.systemctl_calls()[-2:] == ["daemon-reload", f"restart --no-block -- {UNIT}"]
    assert (
        recover_leftover(host, UNIT, record_dir=unit.records, sudo=False, unit_dirs=(str(unit.units),)) == []
    )


def test_a_legacy_dropin_is_restored_and_a_foreign_file_refused(host, unit):
    legacy = unit.legacy / f"{UNIT}.d" / DROPIN_NAME
    legacy.parent.mkdir()
    legacy.write_text("# Written by eagle3-pipeline's serve_check; removed when the check ends.\n[Service]\n")
    found = recover_leftover(host, UNIT, record_dir=unit.records, sudo=False, unit_dirs=(str(unit.legacy),))
    assert found[0]["run"] == "legacy"
    assert not legacy.exists() and not unit.mainpid_alive()  # it was not running: left stopped
    unit.dropin.parent.mkdir()
    unit.dropin.write_text("[Service]\nEnvironment=OPERATOR=1\n")
    with pytest.raises(ServeCheckError, match="not written by eagle3-pipeline"):
        recover_leftover(host, UNIT, record_dir=unit.records, sudo=False, unit_dirs=(str(unit.units),))
    assert unit.dropin.exists()  # never ours to remove


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


def test_the_snapshot_step_restores_a_leftover_first(sshd_server, unit, tmp_path, monkeypatch):
    """scripts/snapshot_server.py calls recover_leftover_dropin before reading the unit."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(sshd_server.ssh_config.read_text())
    monkeypatch.setenv("HOME", str(home))  # fabric reads ~/.ssh/config, as in production
    monkeypatch.setattr(host_record, "RECOVERY_DIRS", (str(unit.units), str(unit.legacy)))
    unit.dropin.parent.mkdir()
    unit.dropin.write_text(dropin_text('"/usr/bin/vllm" "serve" "/draft"', "killed-run", False))
    server = section(ServerSettings, sshd_server.server_cfg(host_state_dir=unit.records))
    found = host_record.recover_leftover_dropin(server)
    assert [f["run"] for f in found] == ["killed-run"] and not unit.dropin.exists()
    assert unit.systemctl_calls()[-2:] == ["daemon-reload", f"stop -- {UNIT}"]


def test_a_whole_remote_check_that_fails_leaves_production_as_it_was(
    sshd_server, unit, tmp_path, monkeypatch
):
    """run_remote_serve_check end to end on the host side: a leftover drop-in restored first, the
    checkpoint copied to a private folder, the drop-in installed and the unit restarted; the stand-in
    server has no /metrics, so the measurement fails; production is then restored and verified, and the
    checkpoint folder removed. (The measurement itself is tested against real vLLM in
    test_serve_check.py.)"""
    from eagle3_pipeline.generate.client import Sampling
    from eagle3_pipeline.validate.production_check import run_remote_serve_check

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(sshd_server.ssh_config.read_text())
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(host_record, "UNIT_DIR", str(unit.units))
    monkeypatch.setattr(host_record, "RECOVERY_DIRS", (str(unit.units), str(unit.legacy)))
    unit_file = tmp_path / "vllm.service"  # systemctl cat is not in the stand-in: the unit file is read
    unit_file.write_text(f"[Service]\nExecStart={COMMAND.raw}\n")
    unit.dropin.parent.mkdir()
    unit.dropin.write_text(dropin_text('"/usr/bin/vllm" "serve" "/draft"', "killed-run", True))
    base = tmp_path / "remote-base"
    server = section(ServerSettings, sshd_server.server_cfg(
        unit_file=str(unit_file), base_url=f"http://127.0.0.1:{unit.port}", start_timeout_s=30,
        api_key_env="E3_NO_KEY", host_state_dir=unit.records,
    ))  # fmt: skip
    validate = ValidateSettings(num_speculative_tokens=3, remote_dir=str(base), enforce_eager=False)
    server_json = {"served_model_name": "kimi-k2", "port": unit.port, "base_url": server.base_url}
    with pytest.raises(Exception, match="metrics"):
        run_remote_serve_check(
            server, validate, server_json, checkpoint(tmp_path / "ckpt"),
            [{"id": "q", "system": None, "question": "hi"}], Sampling("kimi-k2", 8, 0.0, 1.0, None),
            tmp_path / "work",
        )  # fmt: skip
    calls = unit.systemctl_calls()
    (loaded,) = [i for i, c in enumerate(calls) if c.startswith("loaded: ")]  # only ours was ever loaded
    assert calls[:2] == ["daemon-reload", f"restart --no-block -- {UNIT}"]  # the leftover restored first
    assert '"--speculative-config"' in calls[loaded] and str(base) in calls[loaded]  # the private folder
    assert calls[-2:] == ["daemon-reload", f"restart --no-block -- {UNIT}"] and unit.mainpid_alive()
    assert not unit.dropin.exists() and list(base.iterdir()) == []  # checkpoint folder removed
