"""The extraction engine across vLLM releases (issue 48, item 2), without vLLM: what it reads back from
the engine's config on a 0.34-shaped VllmConfig (no `use_v2_model_runner`: 0.34 removed it with the V1
runner) and a 0.32-shaped one, the run-time environment 0.34 refuses dropped before vLLM starts, and a
failure after the model has loaded: failed.json names the cause, the engine's session is gone, and a
waiting client fails at once with it. The config objects carry the fields vLLM's own classes have in
each release (vllm_compat checks these paths in each release's wheel: CONFIG_FIELDS); the engine is
a real vLLM CPU one in tests/integration/test_hidden_states_vllm.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from eagle3_pipeline.hidden_states import engine, engine_health, vllm_worker

SRC = Path(__file__).resolve().parents[2] / "src"


def vllm_config(release: str) -> SimpleNamespace:
    """A VllmConfig with the fields engine_record reads, shaped as `release` has them."""
    config = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector="SyncHiddenStatesConnector"),
        model_config=SimpleNamespace(
            dtype="torch.bfloat16",
            quantization=None,
            max_model_len=513,
            trust_remote_code=False,
            enforce_eager=True,
            multimodal_config=None,
        ),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, enable_expert_parallel=False),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=1024),
        compilation_config=SimpleNamespace(cudagraph_mode="NONE"),
        device_config=SimpleNamespace(device="cpu"),
    )
    if release in ("0.32", "0.33"):
        config.use_v2_model_runner = False  # the CPU build's V1 runner
    return config


def llm(config: SimpleNamespace) -> SimpleNamespace:
    return SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=config))


SPEC = {"start_id": "s1", "layer_ids": [2, 4, 5, 8]}


def test_a_034_config_without_the_v1_runner_is_recorded_as_v2_with_every_field(monkeypatch):
    monkeypatch.setattr(vllm_worker, "_version", lambda: "0.34.0")
    record = vllm_worker.engine_record(llm(vllm_config("0.34")), SPEC, cuda=False)
    assert not hasattr(vllm_config("0.34"), "use_v2_model_runner")
    assert record["runner"] == "v2" and record["vllm_version"] == "0.34.0"
    assert record["dtype"] == "bfloat16" and record["connector"] == "SyncHiddenStatesConnector"
    assert record["max_num_batched_tokens"] == 1024 and record["language_model_only"] is False
    assert record["cudagraph_mode"] == "NONE" and record["device"] == "cpu"
    json.dumps(record)  # ready.json


def test_a_032_config_records_the_runner_it_ran(monkeypatch):
    monkeypatch.setattr(vllm_worker, "_version", lambda: "0.32.0")
    assert vllm_worker.engine_record(llm(vllm_config("0.32")), SPEC, cuda=False)["runner"] == "v1"


def test_a_field_a_release_removed_is_recorded_as_null_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(vllm_worker, "_version", lambda: "0.99.0")
    config = vllm_config("0.34")
    del config.scheduler_config.max_num_batched_tokens
    record = vllm_worker.engine_record(llm(config), SPEC, cuda=False)
    assert record["max_num_batched_tokens"] is None
    assert "scheduler_config.max_num_batched_tokens" in caplog.text


@pytest.mark.parametrize(
    ("version", "value", "dropped"),
    [("0.34.0", "0", True), ("0.34.1", "1", False), ("0.33.0", "0", False), ("0.32.0+cpu", "0", False)],
)
def test_the_v1_runner_switch_is_dropped_where_the_release_refuses_it(version, value, dropped, monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: version)
    environ = {"VLLM_USE_V2_MODEL_RUNNER": value, "VLLM_CPU_KVCACHE_SPACE": "1"}
    gone = vllm_worker.drop_refused_env(environ)
    assert ("VLLM_USE_V2_MODEL_RUNNER" in gone) is dropped
    assert ("VLLM_USE_V2_MODEL_RUNNER" in environ) is not dropped and environ["VLLM_CPU_KVCACHE_SPACE"] == "1"


# The worker's serve() in a session of its own, as engine.py starts it, with vLLM's LLM replaced by an
# engine whose config cannot be read (the crash 0.34 gave the former `config.use_v2_model_runner`).
FAILING_WORKER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from types import SimpleNamespace
    from eagle3_pipeline.hidden_states import vllm_worker

    vllm_worker._is_cuda = lambda: False
    vllm_worker.make_engine = lambda spec, cuda: SimpleNamespace(llm_engine=SimpleNamespace())
    vllm_worker.serve(Path(sys.argv[1]))
    """
)


def test_a_failure_after_the_load_writes_failed_json_ends_the_engine_and_fails_its_client(tmp_path):
    spec = {"start_id": "s1", "staging_dir": str(tmp_path / "staging"), "layer_ids": [2, 4, 5, 8]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    process = subprocess.Popen(
        [sys.executable, "-c", FAILING_WORKER, str(tmp_path)], env=env, start_new_session=True
    )
    info = {"start_id": "s1", "pid": process.pid, "host": os.uname().nodename, "started_at": time.time()}
    assert process.wait(timeout=120) != 0  # gone on its own, never waiting on its engine
    failure = engine_health.read_failure(tmp_path, "s1")
    assert failure["kind"] == "error" and failure["stage"] == "engine record"
    assert "AttributeError" in failure["error"] and "vllm_config" in failure["error"]
    assert not (tmp_path / "ready.json").exists()
    with pytest.raises(engine.EngineError, match="failed after its model loaded, in its engine record"):
        engine.wait_done(tmp_path, info, "a-client-request")  # the client's wait, as it queued at once
