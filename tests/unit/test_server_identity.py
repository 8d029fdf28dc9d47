"""The identity hash: what changes outputs changes it; port, host, parallelism, env and memory do not."""

from __future__ import annotations

from pathlib import Path

from eagle3_pipeline.server.remote import LocalHost
from eagle3_pipeline.server.snapshot import take_snapshot
from eagle3_pipeline.settings import ServerSettings

BASE = "/opt/vllm/bin/vllm serve {model} --port {port} -tp {tp} --max-model-len 4096 {extra}"


def identity(tmp_path: Path, model: str = "/models/m", port: int = 8000, tp: int = 1, extra: str = "",
             env: str = "A=1", template: str | None = None) -> str:  # fmt: skip
    tmp_path.mkdir(parents=True, exist_ok=True)
    if template is not None:
        (tmp_path / "t.jinja").write_text(template)
        extra += f" --chat-template {tmp_path}/t.jinja"
    unit = tmp_path / "vllm.service"
    exec_start = BASE.format(model=model, port=port, tp=tp, extra=extra)
    unit.write_text(f"[Service]\nEnvironment={env}\nExecStart={exec_start}\n")
    cfg = ServerSettings(unit="vllm.service", unit_file=str(unit))
    return take_snapshot(cfg, LocalHost())[1]["identity"]


def test_identity_ignores_what_does_not_change_outputs(tmp_path: Path) -> None:
    ref = identity(tmp_path / "a")
    assert identity(tmp_path / "b", port=9000) == ref
    assert identity(tmp_path / "c", tp=8) == ref
    assert identity(tmp_path / "d", env="A=2 HF_TOKEN=xyz") == ref
    assert identity(tmp_path / "e", extra="--gpu-memory-utilization 0.5 --host 0.0.0.0 --api-key k") == ref


def test_identity_follows_what_changes_outputs(tmp_path: Path) -> None:
    ref = identity(tmp_path / "a", template="T1")
    assert identity(tmp_path / "b", template="T1") == ref
    assert identity(tmp_path / "c", template="T2") != ref  # same path, new template content
    assert identity(tmp_path / "d", model="/models/other", template="T1") != ref
    assert identity(tmp_path / "e", extra="--reasoning-parser kimi_k2", template="T1") != ref
    assert identity(tmp_path / "f", extra="--override-generation-config {}", template="T1") != ref
    assert identity(tmp_path / "g", extra="--served-model-name x", template="T1") != ref


def test_identity_follows_a_rebuilt_local_model(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"a": 1}')
    (model / "model.safetensors").write_bytes(b"x" * 10)
    ref = identity(tmp_path / "a", model=str(model))
    assert identity(tmp_path / "b", model=str(model)) == ref
    (model / "tokenizer_config.json").write_text('{"chat_template": "new"}')
    assert identity(tmp_path / "c", model=str(model)) != ref
