"""Item 12 of the production-safety round: secrets outside vLLM's flags, found by shape and by context;
numbers never redacted; the local server's log written without the key vLLM prints at start."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from eagle3_pipeline import secrets
from eagle3_pipeline.server.local_process import launch_local


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("ExecStartPre=/usr/bin/docker login -u ci -p Regi5tryPassw0rd registry.example", "Regi5tryPassw0rd"),
        ("ExecStartPre=/usr/bin/podman login --password=Regi5tryPassw0rd quay.io", "Regi5tryPassw0rd"),
        ("ExecStartPost=/usr/bin/curl -fsS -u alerts:Curl-Passw0rd-77 https://hooks", "Curl-Passw0rd-77"),
        ("SetCredential=hf-token:CredentialValue123", "CredentialValue123"),
        ("Environment=OPENAI_API_KEYS=firstkey9876,secondkey5432", "firstkey9876,secondkey5432"),
        ("Environment=HTTPS_PROXY=http://proxyuser:Pr0xyPass@proxy:3128", "Pr0xyPass"),
        ("Environment=CACHE_URL=redis://:Red1sPassw0rd@cache:6379/0", "Red1sPassw0rd"),
        ("ExecStartPost=/usr/bin/curl -H 'X-API-Key: apikeyvalue8888' http://x", "apikeyvalue8888"),
        (
            "ExecStartPost=/usr/bin/curl -H 'Authorization: Basic dXNlcjpzZWNyZXQ=' http://x",
            "dXNlcjpzZWNyZXQ=",
        ),
    ],
)
def test_secrets_by_shape_and_context(text: str, secret: str):
    found = secrets.Redactor("s")
    scrubbed = secrets.redact_unit_text(text, found)
    assert secret not in scrubbed and secrets.REDACTED in scrubbed
    assert found.scrub(f"later, alone: {secret.split(',')[0]} .") != f"later, alone: {secret.split(',')[0]} ."


def test_ordinary_options_are_kept():
    text = "ExecStart=/usr/bin/docker run -p 8000:8000 -u 1000 img\nExecStartPost=/usr/bin/curl -u admin http://x"
    assert secrets.redact_unit_text(text, secrets.Redactor("s")) == text


def test_numbers_are_never_redacted():
    """A secret-named variable set to `1` must not turn the tensor-parallel size into a string."""
    found = secrets.Redactor("s")
    secrets.redact_env({"DEBUG_PASSWORD_CHECKS": "1", "HF_TOKEN": "4"}, found)
    data = {"tensor_parallel_size": 1, "port": 4, "ratio": 1.0, "text": "tp 1"}
    assert secrets.redact_data(data, found) == data


def test_the_local_server_log_keeps_no_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """vLLM prints its non-default arguments at start, `--api-key` included."""
    redactor = secrets.Redactor()
    monkeypatch.setattr(secrets, "REDACTOR", redactor)
    secrets.redact_flags({"--api-key": "plainlocalkey42"}, redactor)  # what local_command remembers
    script = (
        "print(\"non-default args: {'model': '/m', 'api_key': ['plainlocalkey42']}\", flush=True)\n"
        "print('INFO key plainlocalkey42, HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456', flush=True)\n"
    )
    proc = launch_local([sys.executable, "-c", script], {}, None, tmp_path, "server")
    deadline = time.monotonic() + 30
    while proc.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.log_tail()  # waits for the filter to write the last lines
    text = (tmp_path / "server.log").read_text()
    assert "non-default args" in text and "HF_TOKEN" in text
    assert "plainlocalkey42" not in text and "hf_abcdefghij" not in text
