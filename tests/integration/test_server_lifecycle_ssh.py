"""The systemd lifecycle over a real sshd: who started the server (ownership), the model checked on
every path, a failed unit noticed at once with its journal tail, and a slow stop polled past the
command timeout. systemctl and journalctl on the remote are tests/data/remote/systemctl-unit, a real
shell script behind which a real process (a small HTTP server) starts and stops: it stands for
systemctl's command-line contract only, not for systemd's unit semantics (see its header)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import pytest
from support.sshd import StandInUnit, kill_stand_in_unit

from eagle3_pipeline import secrets
from eagle3_pipeline.ports import free_port
from eagle3_pipeline.server.health import ServerError
from eagle3_pipeline.server.lifecycle import ensure_running, stop
from eagle3_pipeline.server.ownership import read_ownership
from eagle3_pipeline.server.remote import RemoteHost
from eagle3_pipeline.settings import ServerSettings, SshSettings, section

pytestmark = pytest.mark.ssh
DATA = Path(__file__).parents[1] / "data"
SECRET = "hf_journalSecretToken77"


class FakeUnit(StandInUnit):
    """The stand-in's state folder: the unit's command (exec) and what systemctl recorded."""

    def __init__(self, state: Path, port: int, served: Path) -> None:
        self.state, self.port, self.served = state, port, served

    def set_exec(self, body: str) -> None:
        (self.state / "exec").write_text("#!/bin/sh\n" + body)
        (self.state / "exec").chmod(0o755)

    def serve(self, slow_stop_s: float = 0) -> None:
        """The unit runs an HTTP server answering /health and /v1/models (from files)."""
        command = f"{sys.executable} -m http.server {self.port} --bind 127.0.0.1 --directory {self.served}"
        if slow_stop_s:  # a tensor-parallel server takes long to stop: SIGTERM handled slowly
            self.set_exec(
                f"{command} &\nchild=$!\ntrap 'sleep {slow_stop_s}; kill $child; exit 0' TERM\nwait\n"
            )
        else:
            self.set_exec(f"exec {command}\n")


@pytest.fixture
def unit(sshd_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The stand-in systemctl/journalctl on the remote PATH, and ~/.ssh/config naming vllm-box (fabric
    reads it, as in production)."""
    state, served = tmp_path / "unit-state", tmp_path / "served"
    state.mkdir()
    (served / "v1").mkdir(parents=True)
    (served / "health").write_text("")
    (served / "v1" / "models").write_text(json.dumps({"data": [{"id": "kimi-k2"}]}))
    script = (DATA / "remote" / "systemctl-unit").read_text().replace("@STATE@", str(state))
    for name in ("systemctl", "journalctl"):
        (sshd_server.bin_dir / name).write_text(script)
        (sshd_server.bin_dir / name).chmod(0o755)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(sshd_server.ssh_config.read_text())
    monkeypatch.setenv("HOME", str(home))
    fake = FakeUnit(state, free_port(), served)
    yield fake
    kill_stand_in_unit(state)
    for name in ("systemctl", "journalctl"):
        (sshd_server.bin_dir / name).unlink()


def _cfg(sshd_server, port: int, **extra: object) -> ServerSettings:
    cfg = sshd_server.server_cfg(manage=True, stop_after_generation=True, start_timeout_s=120)
    cfg.update(base_url=f"http://127.0.0.1:{port}", api_key_env="E3_NO_KEY", **extra)
    return section(ServerSettings, cfg)


def _server_json(port: int, served_model_name: str = "kimi-k2") -> dict:
    return {"base_url": f"http://127.0.0.1:{port}", "served_model_name": served_model_name, "port": port}


def _operator_starts(sshd_server) -> None:
    host = RemoteHost(
        "vllm-box", section(SshSettings, sshd_server.server_cfg()["ssh"]), str(sshd_server.ssh_config)
    )
    try:
        assert host.run("systemctl start -- vllm.service").ok
    finally:
        host.close()


def _wait_health(port: int) -> None:
    from eagle3_pipeline.server.health import wait_healthy

    wait_healthy(f"http://127.0.0.1:{port}", 20)


def test_a_server_the_pipeline_did_not_start_is_left_running(sshd_server, unit, tmp_path: Path) -> None:
    unit.serve()
    _operator_starts(sshd_server)  # production already serving users
    _wait_health(unit.port)
    cfg, state = _cfg(sshd_server, unit.port), tmp_path / "work-server"
    assert ensure_running(_server_json(unit.port), cfg, state) == f"http://127.0.0.1:{unit.port}"
    assert read_ownership(state)["started_by_pipeline"] is False
    report = stop(_server_json(unit.port), cfg, state)
    assert report["action"] == "left running" and "did not start" in report["why"]
    assert unit.mainpid_alive() and not any(" stop" in c for c in unit.calls())
    # the operator who wants otherwise
    report = stop(_server_json(unit.port), dataclasses.replace(cfg, stop_foreign=True), state)
    assert report["action"] == "stopped" and not unit.mainpid_alive()


def test_the_model_is_checked_when_the_server_already_answers(sshd_server, unit, tmp_path: Path) -> None:
    unit.serve()
    _operator_starts(sshd_server)
    _wait_health(unit.port)
    with pytest.raises(ServerError, match="not 'other-model'"):
        ensure_running(_server_json(unit.port, "other-model"), _cfg(sshd_server, unit.port), tmp_path / "s")


def test_a_server_the_pipeline_started_is_stopped_without_blocking(sshd_server, unit, tmp_path: Path) -> None:
    unit.serve(slow_stop_s=4)  # longer than the 2 s command timeout below
    cfg = _cfg(sshd_server, unit.port, stop_timeout_s=60)
    cfg = dataclasses.replace(cfg, ssh=dataclasses.replace(cfg.ssh, command_timeout_s=2))
    state = tmp_path / "work-server"
    ensure_running(_server_json(unit.port), cfg, state)
    owner = read_ownership(state)
    assert owner["started_by_pipeline"] is True and len(owner["invocation_id"]) == 32
    start = time.monotonic()
    report = stop(_server_json(unit.port), cfg, state)
    assert report["action"] == "stopped" and report["state"] == "inactive"
    assert time.monotonic() - start >= 4 and not unit.mainpid_alive()
    assert "systemctl stop --no-block -- vllm.service" in unit.calls()
    assert read_ownership(state) is None


def test_stop_times_out_on_its_own_timeout_with_the_journal(sshd_server, unit, tmp_path: Path) -> None:
    unit.serve(slow_stop_s=30)
    cfg, state = _cfg(sshd_server, unit.port, stop_timeout_s=2), tmp_path / "work-server"
    ensure_running(_server_json(unit.port), cfg, state)
    with pytest.raises(
        ServerError, match=r"still deactivating 2 s after `systemctl stop` \(server.stop_timeout_s\)"
    ):
        stop(_server_json(unit.port), cfg, state)


def test_a_server_restarted_by_someone_else_is_left_running(sshd_server, unit, tmp_path: Path) -> None:
    unit.serve()
    cfg, state = _cfg(sshd_server, unit.port), tmp_path / "work-server"
    ensure_running(_server_json(unit.port), cfg, state)
    host = RemoteHost(
        "vllm-box", section(SshSettings, sshd_server.server_cfg()["ssh"]), str(sshd_server.ssh_config)
    )
    try:  # an operator restarts it (a new InvocationID): no longer the pipeline's start
        assert host.run("systemctl stop -- vllm.service").ok
        assert host.run("systemctl start -- vllm.service").ok
    finally:
        host.close()
    report = stop(_server_json(unit.port), cfg, state)
    assert report["action"] == "left running" and "InvocationID" in report["why"]
    assert unit.mainpid_alive()


def test_a_failed_unit_ends_the_wait_at_once_with_its_journal(sshd_server, unit, tmp_path: Path) -> None:
    secrets.REDACTOR.add(SECRET)  # as the snapshot's parse of the unit teaches it in production
    unit.set_exec(
        f"echo 'loading with HF_TOKEN={SECRET}'\necho 'torch.OutOfMemoryError: CUDA out of memory'\nexit 1\n"
    )
    cfg = _cfg(sshd_server, unit.port)  # start_timeout_s 120
    start = time.monotonic()
    with pytest.raises(ServerError) as info:
        ensure_running(_server_json(unit.port), cfg, tmp_path / "work-server")
    assert time.monotonic() - start < 30  # not the 120 s start timeout
    message = str(info.value)
    assert "vllm.service stopped running (systemd state failed" in message
    assert "CUDA out of memory" in message and SECRET not in message
    assert any(c.startswith("journalctl -u vllm.service -n 50 --no-pager") for c in unit.calls())
