"""Secrets never reach a file, a log line, a traceback or an error message."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from eagle3_pipeline.server import api_key, auth_headers
from eagle3_pipeline.server.secrets import (
    REDACTED,
    RedactingFilter,
    Redactor,
    is_secret_name,
    redact_unit_text,
)
from eagle3_pipeline.server.snapshot import SnapshotError, snapshot_server

SECRET_VALUES = ("hf_unitTestToken001", "sk-unit-test-key-002", "pw-unit-test-003", "sk-cli-unit-004")
UNIT = f"""[Service]
Environment="HF_TOKEN={SECRET_VALUES[0]}" VLLM_API_KEY={SECRET_VALUES[1]} TOKENIZERS_PARALLELISM=false
Environment=DB_PASSWORD={SECRET_VALUES[2]}
ExecStart=/opt/vllm/bin/vllm serve /models/m --port 8000 \\
    --api-key {SECRET_VALUES[3]}
"""


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "VLLM_API_KEY",
        "MY_SECRET",
        "DB_PASSWORD",
        "--api-key",
        "--hf-token",
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name", ["TOKENIZERS_PARALLELISM", "HF_HOME", "--max-num-batched-tokens", "--tokenizer", "KEYS"]
)
def test_not_secret_names(name: str) -> None:
    assert not is_secret_name(name)


def test_unit_text_redaction_keeps_variable_references() -> None:
    text = redact_unit_text(UNIT + "ExecStartPost=/bin/x --api-key $VLLM_API_KEY\n", Redactor())
    for secret in SECRET_VALUES:
        assert secret not in text
    assert "--api-key $VLLM_API_KEY" in text and "TOKENIZERS_PARALLELISM=false" in text


def test_snapshot_outputs_and_log_have_no_secret(tmp_path: Path) -> None:
    unit_file = tmp_path / "vllm.service"
    unit_file.write_text(UNIT)
    log_file = tmp_path / "snapshot.log"
    handler = logging.FileHandler(log_file)
    handler.addFilter(RedactingFilter())
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    try:
        cfg = {"host": "local", "unit": "vllm.service", "unit_file": str(unit_file)}
        outs = [tmp_path / "out" / n for n in ("unit.service", "server.json", "identity.json")]
        snapshot_server(cfg, *map(str, outs))
        logging.getLogger("test").info("echo of a secret: %s", SECRET_VALUES[1])
        try:
            raise RuntimeError(f"failure mentioning {SECRET_VALUES[3]}")
        except RuntimeError:
            logging.getLogger("test").exception("traceback")
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    for path in [*outs, log_file]:
        text = path.read_text()
        for secret in SECRET_VALUES:
            assert secret not in text, f"{secret} in {path.name}"
    assert REDACTED in log_file.read_text() and "RuntimeError" in log_file.read_text()


def test_error_messages_are_scrubbed(tmp_path: Path) -> None:
    """An error about a file whose name carries a secret value still hides it."""
    unit_file = tmp_path / "vllm.service"
    unit_file.write_text(UNIT + f"EnvironmentFile=/nonexistent/{SECRET_VALUES[1]}\n[broken\n")
    cfg = {"host": "local", "unit": "vllm.service", "unit_file": str(unit_file)}
    with pytest.raises(SnapshotError) as info:
        snapshot_server(cfg, *(str(tmp_path / n) for n in ("u", "s", "i")))
    assert "expected KEY=VALUE" in str(info.value)
    for secret in SECRET_VALUES:
        assert secret not in str(info.value)


def test_api_key_from_env_or_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("E3_TEST_KEY", raising=False)
    cfg = {"api_key_env": "E3_TEST_KEY", "api_key_file": None}
    assert api_key(cfg) is None and auth_headers(cfg) == {}
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    assert api_key({**cfg, "api_key_file": str(key_file)}) == "from-file"
    monkeypatch.setenv("E3_TEST_KEY", "from-env")
    assert auth_headers({**cfg, "api_key_file": str(key_file)}) == {"Authorization": "Bearer from-env"}
