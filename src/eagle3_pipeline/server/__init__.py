"""The vLLM server as a systemd unit: snapshot (unit parser, vLLM flags, SSH) and lifecycle; the redaction
of its secrets is eagle3_pipeline.secrets, its snapshot read back eagle3_pipeline.server_json."""

from __future__ import annotations

import os
from pathlib import Path

from eagle3_pipeline.settings import ServerSettings


def api_key(server: ServerSettings) -> str | None:
    """The server's API key, from the environment variable `server.api_key_env` or the file
    `server.api_key_file`; None when neither holds one. Requests send it as a bearer token."""
    name = server.api_key_env
    if name and os.environ.get(name):
        return os.environ[name].strip()
    if server.api_key_file:
        key = Path(os.path.expanduser(server.api_key_file)).read_text().strip()
        return key or None
    return None


def auth_headers(server: ServerSettings) -> dict[str, str]:
    """`Authorization: Bearer KEY` when an API key is configured, else no header."""
    key = api_key(server)
    return {"Authorization": f"Bearer {key}"} if key else {}


def tls_verify(server: ServerSettings) -> bool | str:
    """What `requests` verifies an https server with: `server.ca_bundle` (a PEM file) when set, else
    the system's trust store (True)."""
    return server.ca_bundle or True
