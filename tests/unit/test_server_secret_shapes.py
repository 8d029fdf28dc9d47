"""Secrets found by shape and by name in env files, unit text and journal lines (issue 35, item 4):
every value of a multi-value secret flag, Basic/Bearer credentials in any header form, URL userinfo,
names containing TOKEN/KEY/SECRET/PASSWORD with any suffix, vLLM's own argument dumps."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from eagle3_pipeline.secrets import (
    REDACTED,
    Redactor,
    is_secret_name,
    redact_unit_text,
    scrub_patterns,
)
from eagle3_pipeline.server.remote import LocalHost
from eagle3_pipeline.server.snapshot import take_snapshot
from eagle3_pipeline.settings import ServerSettings

BASIC = base64.b64encode(b"otel-user:otel-pass-1").decode()


@pytest.mark.parametrize(
    ("text", "secrets", "kept"),
    [
        (
            "vllm serve /m --api-key key-one-1 key-two-2 --port 8000",
            ["key-one-1", "key-two-2"],
            "--port 8000",
        ),
        (
            "vllm serve /m --api-key key-one-1 \\\n    'key two 2' \\\n    --port 8000",
            ["key-one-1", "key two 2"],
            "--port 8000",
        ),
        ("vllm serve /m --api_key key-one-1 key-two-2; echo done", ["key-one-1", "key-two-2"], "; echo done"),
        ("vllm serve /m --api-key=key-one-1 --port 8000", ["key-one-1"], "--port 8000"),
        (f"OTEL_EXPORTER_OTLP_HEADERS=Authorization=Basic%20{BASIC},x-tenant=lab", [BASIC], "x-tenant=lab"),
        (f"OTEL_EXPORTER_OTLP_HEADERS=authorization=Basic {BASIC}", [BASIC], "OTEL_EXPORTER"),
        ("OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20tok.en-123", ["tok.en-123"], "Bearer%20"),
        ('curl -H "Proxy-Authorization: opaque-token-99" x', ["opaque-token-99"], "curl -H"),
        (
            "OTEL_EXPORTER_OTLP_HEADERS=x-api-key=abc-123-def,dd-api-key=zz-99-yy",
            ["abc-123-def", "zz-99-yy"],
            "OTEL",
        ),
        (f"the header was Basic {BASIC} then", [BASIC], "then"),
        (
            "HTTPS_PROXY=http://proxy-user:p@ss-w0rd@proxy.internal:3128/",
            ["p@ss-w0rd", "ss-w0rd"],
            "proxy.internal:3128",
        ),
        (
            "git remote https://ghp1234567890abcdefghijkl@github.com/x",
            ["ghp1234567890abcdefghijkl"],
            "github.com",
        ),
        (
            "HF_TOKEN2=value-of-token-2 WANDB_API_KEY_OLD=wandb-key-x",
            ["value-of-token-2", "wandb-key-x"],
            "HF_TOKEN2=",
        ),
        (
            "GITHUBTOKEN=gh-secret-1 db_password_v2=pw-v2-secret",
            ["gh-secret-1", "pw-v2-secret"],
            "GITHUBTOKEN=",
        ),
        (
            "args: Namespace(model='/m', api_key=['k1-abc', 'k2]x'], port=8000, hf_token=None)",
            ["k1-abc", "k2]x"],
            "port=8000, hf_token=None)",
        ),
        ("non-default args: {'model': '/m', 'api_key': ['k'], 'port': 8001}", ["'k'"], "'port': 8001}"),
        ("Namespace(api_key='quote\\'d-key', x=1)", ["quote"], ", x=1)"),
    ],
)
def test_secret_is_found_and_the_rest_kept(text: str, secrets: list[str], kept: str) -> None:
    found = Redactor("t")
    out = scrub_patterns(text, found)
    for secret in secrets:
        assert secret not in out, out
    assert kept in out and REDACTED in out
    assert scrub_patterns(out) == out  # scrubbing twice changes nothing (no mangled fragment)


@pytest.mark.parametrize(
    "text",
    [
        "vllm serve /m --tokenizer /models/tok --max-num-batched-tokens 8192",
        "TOKENIZERS_PARALLELISM=false MAX_TOKENS=100 SSL_KEYFILE=/etc/ssl/k.pem HF_TOKEN_PATH=/x",
        "Basic authentication is off; see http://proxy.internal:3128/ and ssh://git@host/x",
        "Namespace(api_key=None, port=8000)",
    ],
)
def test_lookalikes_are_kept(text: str) -> None:
    assert scrub_patterns(text) == text


@pytest.mark.parametrize(
    "name", ["HF_TOKEN2", "HF_TOKEN_RO", "GITHUBTOKEN", "APIKEY", "MY_SECRET_V2", "PASSWORD1"]
)
def test_secret_names_with_any_suffix(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["--tokenizer", "TOKENIZERS_PARALLELISM", "--max-num-batched-tokens", "--long-prefill-token-threshold",
     "--ssl-keyfile", "HF_TOKEN_PATH", "KEYS", "PWD", "--return-tokens-as-token-ids"],
)  # fmt: skip
def test_lookalike_names(name: str) -> None:
    assert not is_secret_name(name)


def test_no_secret_shape_reaches_server_json_or_the_unit(tmp_path: Path) -> None:
    """A unit with each shape in its text, an env file (a multi-line value too) and the words after a
    `bash -c` script: none of the values is written, and the job's redactor hides them in a journal
    line afterwards."""
    secrets = [
        "kk-first-111",
        "kk-second-222",
        BASIC,
        "pr0xy-pass",
        "hf-two-333",
        "multi\nline-444",
        "pos-key-555",
    ]
    env_file = tmp_path / "vllm.env"
    env_file.write_text(
        f'HF_TOKEN2=hf-two-333\nSECRET_NOTE="{secrets[5]}"\nHTTP_PROXY=http://u:pr0xy-pass@p:1\n'
    )
    unit_file = tmp_path / "vllm.service"
    unit_file.write_text(
        f'[Service]\nEnvironment="OTEL_EXPORTER_OTLP_HEADERS=Authorization=Basic%20{BASIC}"\n'
        f"EnvironmentFile={env_file}\n"
        "ExecStart=/bin/bash -c 'exec vllm serve \"$@\"' launch /m --api-key kk-first-111 kk-second-222 "
        "--served-model-name m --hf-token pos-key-555\n"
    )
    settings = ServerSettings(unit="vllm.service", unit_file=str(unit_file))
    unit_text, server, identity = take_snapshot(settings, LocalHost())
    written = unit_text + json.dumps(server) + json.dumps(identity)
    for secret in secrets:
        assert secret not in written and secret.replace("\n", "\\n") not in written
    assert server["served_model_name"] == "m" and server["port"] == 8000
    found = Redactor()
    found.learn(server["redaction"])
    journal = "INFO non-default args: {'api_key': ['kk-first-111', 'kk-second-222']} proxy pr0xy-pass"
    assert "kk-" not in found.scrub(journal) and "pr0xy" not in found.scrub(journal)


def test_unit_text_keeps_variable_references_for_several_values() -> None:
    text = redact_unit_text("ExecStart=/x --api-key $VLLM_API_KEY ${SECOND_KEY} --port 1\n", Redactor())
    assert text == "ExecStart=/x --api-key $VLLM_API_KEY ${SECOND_KEY} --port 1\n"


def test_an_export_in_a_bash_c_script_is_hidden_whole() -> None:
    found = Redactor("t")
    out = scrub_patterns("ExecStart=/bin/bash -c 'export HF_TOKEN=abc123secret; exec vllm serve /m'", found)
    assert out == "ExecStart=/bin/bash -c 'export HF_TOKEN=<redacted>; exec vllm serve /m'"
    assert found.scrub_known("abc123secret") == REDACTED
