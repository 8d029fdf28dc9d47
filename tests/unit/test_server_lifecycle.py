"""Lifecycle without vLLM: a unit whose ExecStart fails ends the wait at once with the log's tail;
unmanaged servers are never started; stop only stops what the pipeline started."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from eagle3_pipeline.server.health import ServerError
from eagle3_pipeline.server.lifecycle import ensure_running, stop
from eagle3_pipeline.server.local_process import find_local, launch_local
from eagle3_pipeline.settings import ServerSettings, section

PORT = 18533  # nothing listens here


def _cfg(tmp_path: Path, exec_start: str, **extra: object) -> ServerSettings:
    unit = tmp_path / "failing.service"
    unit.write_text(
        f"[Service]\nEnvironment=MESSAGE=boom-from-the-unit HF_TOKEN=hf_lifecycleSecret99\n"
        f"WorkingDirectory={tmp_path}\nExecStart={exec_start}\n"
    )
    cfg = {"host": "local", "unit": "failing.service", "unit_file": str(unit), "manage": True,
           "stop_after_generation": True, "start_timeout_s": 60, "api_key_env": "E3_NO_KEY"}  # fmt: skip
    cfg.update(extra)
    return section(ServerSettings, cfg)


SERVER_JSON = {"base_url": f"http://127.0.0.1:{PORT}", "served_model_name": "m", "port": PORT, "host": None}


def test_failing_exec_start_shows_the_log_tail(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "/bin/sh -c 'echo \"$MESSAGE in $(pwd) $HF_TOKEN\"; exit 3'")
    state = tmp_path / "state"
    start = time.monotonic()
    with pytest.raises(ServerError) as info:
        ensure_running(SERVER_JSON, cfg, state)
    message = str(info.value)
    assert "process exited" in message
    assert f"boom-from-the-unit in {tmp_path}" in message  # Environment= and WorkingDirectory= applied
    assert "hf_lifecycleSecret99" not in message  # the log tail is scrubbed
    assert time.monotonic() - start < 30  # an exited process ends the wait, not start_timeout_s
    assert (state / "failing.service.log").exists()


def test_health_timeout_shows_the_log_tail(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "/bin/sh -c 'echo still-loading; exec sleep 60'", start_timeout_s=2)
    state = tmp_path / "state"
    with pytest.raises(ServerError, match=r"(?s)no healthy /health within 2 s.*still-loading"):
        ensure_running(SERVER_JSON, cfg, state)
    proc = find_local(state, "failing.service")
    assert proc is not None  # left running: a later job waits for it instead of starting another
    owner = json.loads((state / "ownership.json").read_text())
    assert owner["started_by_pipeline"] is True and owner["pid"] == proc.pid
    assert stop(SERVER_JSON, cfg, state)["action"] == "stopped"
    assert not (state / "ownership.json").exists()
    assert find_local(state, "failing.service") is None


def test_unmanaged_server_is_not_started(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "/bin/false", manage=False)
    with pytest.raises(ServerError, match="server.manage is false"):
        ensure_running(SERVER_JSON, cfg, tmp_path / "state")
    assert not (tmp_path / "state").exists()


def test_stop_reports_what_it_did(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "/bin/false")
    assert stop(SERVER_JSON, cfg, tmp_path / "s")["action"] == "none"
    assert (
        stop(SERVER_JSON, dataclasses.replace(cfg, stop_after_generation=False), tmp_path / "s")["action"]
        == "left running"
    )


def test_launch_local_stop_kills_the_process_group(tmp_path: Path) -> None:
    proc = launch_local(["/bin/sh", "-c", "sleep 60 & sleep 60"], {}, None, tmp_path, "group")
    assert proc.alive() and proc.pid_file.exists()
    assert proc.stop(timeout_s=5)
    assert not proc.alive() and not proc.pid_file.exists()


def test_local_command_teaches_the_redactor(tmp_path: Path) -> None:
    from eagle3_pipeline.secrets import REDACTOR
    from eagle3_pipeline.server.local_process import local_command

    cfg = _cfg(tmp_path, "/opt/vllm/bin/vllm serve /m --api-key sk-local-command-key-55")
    argv, env, cwd = local_command(cfg)
    assert (
        "sk-local-command-key-55" in argv and env["HF_TOKEN"] == "hf_lifecycleSecret99"
    )  # real values to run
    assert cwd == str(tmp_path)
    scrubbed = REDACTOR.scrub(" ".join(argv) + " " + env["HF_TOKEN"])  # what a log line would show
    assert "sk-local-command-key-55" not in scrubbed and "hf_lifecycleSecret99" not in scrubbed


def test_a_local_unit_runs_in_its_working_directory_as_systemd_reads_it(tmp_path: Path) -> None:
    """WorkingDirectory=~ is the User's home (root's without User=), never a folder named `~`."""
    from eagle3_pipeline.server.local_process import local_command

    cfg = _cfg(tmp_path, "/opt/vllm/bin/vllm serve /m")
    unit = Path(cfg.unit_file)
    unit.write_text(unit.read_text().replace(f"WorkingDirectory={tmp_path}", "WorkingDirectory=~"))
    assert local_command(cfg)[2] == "/root"


def test_health_and_model_checks_verify_https_with_the_ca_bundle(tmp_path: Path) -> None:
    """A server behind https signed by a private CA: with server.ca_bundle the health wait and the
    model check pass; without it, the server is not seen as healthy (the certificate is untrusted)."""
    from support.http_endpoint import ScriptedEndpoint
    from support.tls import self_signed, tls_context

    from eagle3_pipeline.server.health import check_health, wait_healthy

    cert, key = self_signed(tmp_path)
    endpoint = ScriptedEndpoint(tls=tls_context(cert, key)).start()
    try:
        url = endpoint.base_url
        assert url.startswith("https://")
        cfg = ServerSettings(unit="gw.service", manage=False, base_url=url, api_key_env="E3_NO_KEY",
                             ca_bundle=str(cert))  # fmt: skip
        wait_healthy(url, 10, verify=str(cert))
        served = {**SERVER_JSON, "base_url": url, "served_model_name": endpoint.model}
        assert ensure_running(served, cfg, tmp_path / "state") == url
        assert not check_health(url)  # the system's trust store does not know the test CA
        with pytest.raises(ServerError, match="does not answer and server.manage is false"):
            ensure_running(served, dataclasses.replace(cfg, ca_bundle=None), tmp_path / "state2")
    finally:
        endpoint.stop()
