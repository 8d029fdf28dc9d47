"""Secrets never reach a file, a log line, a traceback or an error message."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_pipeline.secrets import (
    REDACTED,
    RedactingFilter,
    Redactor,
    is_secret_name,
    learn,
    redact_data,
    redact_unit_text,
    scrub_patterns,
)
from eagle3_pipeline.server import api_key, auth_headers
from eagle3_pipeline.server.remote import LocalHost, secret_file_command, write_secret_file
from eagle3_pipeline.server.snapshot import SnapshotError, snapshot_server
from eagle3_pipeline.settings import ServerSettings

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
        cfg = ServerSettings(unit="vllm.service", unit_file=str(unit_file))
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
    secret = SECRET_VALUES[1]
    unit_file.write_text(UNIT + f"EnvironmentFile=/nonexistent/{secret}\nExecStart=/x '{secret}\n")
    cfg = ServerSettings(unit="vllm.service", unit_file=str(unit_file))
    with pytest.raises(SnapshotError) as info:
        snapshot_server(cfg, *(str(tmp_path / n) for n in ("u", "s", "i")))
    assert "unbalanced ' quote" in str(info.value)
    for secret in SECRET_VALUES:
        assert secret not in str(info.value)


def test_api_key_from_env_or_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("E3_TEST_KEY", raising=False)
    cfg = ServerSettings(api_key_env="E3_TEST_KEY", api_key_file=None)
    assert api_key(cfg) is None and auth_headers(cfg) == {}
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    assert api_key(dataclasses.replace(cfg, api_key_file=str(key_file))) == "from-file"
    monkeypatch.setenv("E3_TEST_KEY", "from-env")
    assert auth_headers(dataclasses.replace(cfg, api_key_file=str(key_file))) == {
        "Authorization": "Bearer from-env"
    }


# Secrets found by their shape: none of these is under a secret name where it appears.
SHAPED = {
    "hf": "hf_" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3h",
    "sk": "sk-proj-" + "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8",
    "ghp": "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
    "github_pat": "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    "aws": "AKIA" + "IOSFODNN7EXAMPLE",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk",
    "bearer": "opaque-bearer-value-0042",
    "url_password": "s3cr3t-url-pass",
}


@pytest.mark.parametrize("kind", sorted(SHAPED))
def test_secrets_found_by_shape(kind: str) -> None:
    value = SHAPED[kind]
    text = {
        "bearer": f"curl -H 'Authorization: Bearer {value}' http://x",
        "url_password": f"git clone https://deploy:{value}@git.example.com/m.git",
    }.get(kind, f"export THING={value}; echo {value} done")
    scrubbed = Redactor().scrub(text)
    assert value not in scrubbed and REDACTED in scrubbed


@pytest.mark.parametrize(
    "text",
    ["--hf-overrides '{}'", "hf_transfer_enabled", "tokenizer=abc", "--max-num-batched-tokens 8192",
     "prompt_token_ids", "sk-short", "version 1.2.3"],
)  # fmt: skip
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert Redactor().scrub(text) == text


def test_value_matched_on_token_boundaries_only() -> None:
    redactor = Redactor(salt="s")
    redactor.add("8000")
    assert redactor.scrub("port 8000, url http://h:8000/v1") == f"port {REDACTED}, url http://h:{REDACTED}/v1"
    assert redactor.scrub("port 18000 80001 x8000 8000x") == "port 18000 80001 x8000 8000x"
    redactor.add("pw-unit-test-003")
    assert redactor.scrub("id=pw-unit-test-003.") == f"id={REDACTED}."


def test_fingerprints_carry_secrets_to_another_process_without_values(tmp_path: Path) -> None:
    """The snapshot shares fingerprints only; a fresh process that learns server.json hides every
    value the unit named (a Bearer token of ExecStartPre=, --api-key, an environment file's key)."""
    bearer, cli_key, file_key = "zq81-bearer-in-pre", "zq82-cli-api-key", "zq83-env-file-key"
    (tmp_path / "vllm.env").write_text(f"OPENAI_API_KEY={file_key}\n")
    unit_file = tmp_path / "vllm.service"
    unit_file.write_text(
        "[Service]\n"
        f"EnvironmentFile={tmp_path}/vllm.env\n"
        f"ExecStartPre=/usr/bin/curl -H 'Authorization: Bearer {bearer}' http://registry/ping\n"
        f"ExecStart=/opt/vllm/bin/vllm serve /models/m --port 8000 --api-key {cli_key}\n"
    )
    cfg = ServerSettings(unit="vllm.service", unit_file=str(unit_file))
    outs = [tmp_path / "out" / n for n in ("unit.service", "server.json", "identity.json")]
    snapshot_server(cfg, *map(str, outs))
    for path in outs:
        for secret in (bearer, cli_key, file_key):
            assert secret not in path.read_text(), f"{secret} in {path.name}"
    vllm_log = (
        f"non-default args: {{'api_key': ['{cli_key}'], 'port': 8000}}\n"
        f"Authorization failed for {bearer}; env key {file_key}\n"
    )
    code = (
        "import json, sys\n"
        "from eagle3_pipeline import secrets\n"
        "secrets.learn(json.load(open(sys.argv[1])))\n"
        "sys.stdout.write(secrets.REDACTOR.scrub(sys.stdin.read()))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    done = subprocess.run(
        [sys.executable, "-c", code, str(outs[1])], input=vllm_log, capture_output=True, text=True,
        env=env, check=True,
    )  # fmt: skip
    for secret in (bearer, cli_key, file_key):
        assert secret not in done.stdout
    assert done.stdout.count(REDACTED) == 3 and "'port': 8000" in done.stdout


def test_json_outputs_stay_valid_when_a_secret_is_a_number(tmp_path: Path) -> None:
    """A short secret such as `8000` is replaced where it is a secret, never inside the JSON text, and
    numbers are never redacted (the port stays a number)."""
    unit_file = tmp_path / "vllm.service"
    unit_file.write_text("[Service]\nExecStart=/opt/vllm/bin/vllm serve m --port 8000 --api-key 8000\n")
    cfg = ServerSettings(unit="vllm.service", unit_file=str(unit_file))
    outs = [tmp_path / n for n in ("unit.service", "server.json", "identity.json")]
    snapshot_server(cfg, *map(str, outs))
    server = json.loads(outs[1].read_text())
    json.loads(outs[2].read_text())
    assert server["args"]["--api-key"] == REDACTED and server["port"] == 8000
    assert "--api-key 8000" not in outs[0].read_text()


def test_redact_data_keeps_structure() -> None:
    redactor = Redactor()
    redactor.add("8000")
    data = {"port": 8000, "n": 18000, "HF_TOKEN": "x", "flag": True, "ids": [8000, 1], "msg": "at :8000/"}
    assert redact_data(data, redactor) == {
        "port": 8000, "n": 18000, "HF_TOKEN": REDACTED, "flag": True, "ids": [8000, 1],
        "msg": f"at :{REDACTED}/",
    }  # fmt: skip


def test_log_filter_hides_learned_values(tmp_path: Path) -> None:
    redactor = Redactor()
    source = Redactor(salt="unit-salt")
    source.add("zq84-learned-secret")
    learn({"redaction": source.export()}, redactor)
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "tail: %s", ("zq84-learned-secret",), None)
    RedactingFilter(redactor).filter(record)
    assert record.getMessage() == f"tail: {REDACTED}"


def test_secret_file_goes_through_stdin(tmp_path: Path) -> None:
    """Text with a secret reaches the file through stdin: the command line never holds it."""
    text = "[Service]\nExecStart=\nExecStart=/x/vllm serve m --api-key zq85-dropin-secret\n"
    path = tmp_path / "d" / "zz.conf"
    path.parent.mkdir()
    command = secret_file_command(str(path), sudo=False)
    assert "zq85" not in command
    result = write_secret_file(LocalHost(), str(path), text, sudo=False)
    assert result.ok, result.stderr
    assert path.read_text() == text and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert write_secret_file(LocalHost(), str(path), "short\n", sudo=False).ok
    assert path.read_text() == "short\n"  # replaced, not appended


@pytest.mark.parametrize(
    "dump",
    [
        "non-default args: {'model': '/m', 'api_key': ['first-secret-1234', 'second-secret-5678']}",
        "non-default args: {'model': '/m', 'my_gateway_token': 'first-secret-1234', 'port': 8000}",
        "{'extra': {'upstream_password': ['first-secret-1234', \"second-secret-5678\"]}, 'model': '/m'}",
        '{"model": "/m", "OPENAI_API_KEYS": ["first-secret-1234", "second-secret-5678"]}',
        "Namespace(model='/m', api_key=['first-secret-1234', 'second-secret-5678'], port=8000)",
        "Namespace(model='/m', hf_token2='first-secret-1234', port=8000)",
    ],
    ids=["vllm-list", "unknown-key-scalar", "nested-unknown-list", "json-list", "namespace", "suffix"],
)
def test_argument_dumps_with_unknown_keys_and_list_values_are_redacted(dump: str) -> None:
    """vLLM's start-up line prints its arguments as a Python dict (or a Namespace); a key named like a
    secret hides its value, and every item of a list, whatever the key and wherever it stands, with
    no redactor having seen the value before and without mangling what surrounds it."""
    redactor = Redactor()
    text = redactor.scrub(dump)
    assert "first-secret-1234" not in text and "second-secret-5678" not in text, text
    assert "/m" in text and REDACTED in text
    assert text.count("[") == dump.count("[") and text.count("]") == dump.count("]"), text
    collected = Redactor()
    scrub_patterns(dump, collected)  # the snapshot's collecting pass remembers every item on its own
    assert collected.scrub_known("x first-secret-1234 y") == f"x {REDACTED} y"
    if "second-secret-5678" in dump:
        assert collected.scrub_known("second-secret-5678") == REDACTED
