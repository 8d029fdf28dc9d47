"""Lifecycle against the real vLLM CPU server serving the demo target: snapshot of the demo unit,
start from the unit file (exactly once for parallel jobs), health wait, model check, stop."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from eagle3_pipeline.server.health import ServerError, check_health, check_model
from eagle3_pipeline.server.lifecycle import ensure_running, stop
from eagle3_pipeline.server.snapshot import snapshot_server
from eagle3_pipeline.settings import ServerSettings

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
PORT = 18534


@pytest.fixture
def demo_unit(tmp_path: Path) -> Path:
    """The demo's unit template rendered for the demo target on PORT."""
    from support.vllm_server import UNIT_TEMPLATE, demo_target_dir

    from eagle3_pipeline.demo.target import render_unit

    unit = tmp_path / "vllm-demo.service"
    unit.write_text(render_unit(UNIT_TEMPLATE.read_text(), REPO, demo_target_dir(), PORT))
    return unit


def test_start_health_model_check_stop(demo_unit: Path, tmp_path: Path) -> None:
    cfg = ServerSettings(
        unit="vllm-demo.service", unit_file=str(demo_unit), start_timeout_s=600, api_key_env="E3_NO_KEY"
    )
    out, state = tmp_path / "server", tmp_path / "state"
    server = snapshot_server(
        cfg, str(out / "unit.service"), str(out / "server.json"), str(out / "identity.json")
    )
    assert server["base_url"] == f"http://127.0.0.1:{PORT}"
    assert server["served_model_name"] == "eagle3-demo-target" and server["reasoning_parser"] == "kimi_k2"
    assert server["unresolved"] == []
    assert server["vllm_version"].startswith("0.")  # read from .venv-vllm's package metadata
    server = json.loads((out / "server.json").read_text())

    urls: list[str] = []
    errors: list[BaseException] = []

    def job() -> None:  # two generation shard jobs asking at once
        try:
            urls.append(ensure_running(server, cfg, state))
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    try:
        threads = [threading.Thread(target=job) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert urls == [server["base_url"]] * 2
        log_text = (state / "vllm-demo.service.log").read_text()
        assert log_text.count("--- starting") == 1  # started exactly once
        assert ensure_running(server, cfg, state) == server["base_url"]  # healthy: returns at once
        with pytest.raises(ServerError, match="not 'another-model'"):
            check_model(server["base_url"], "another-model")
    finally:
        report = stop(server, cfg, state)
    assert report["action"] == "stopped"
    assert not check_health(server["base_url"])
