"""The vLLM server as a systemd unit: snapshot (unit parser, vLLM flags, secrets, SSH) and lifecycle."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def api_key(server_cfg: dict[str, Any]) -> str | None:
    """The server's API key, from the environment variable `server.api_key_env` or the file
    `server.api_key_file`; None when neither holds one. Requests send it as a bearer token."""
    name = server_cfg.get("api_key_env")
    if name and os.environ.get(name):
        return os.environ[name].strip()
    path = server_cfg.get("api_key_file")
    if path:
        key = Path(os.path.expanduser(path)).read_text().strip()
        return key or None
    return None


def auth_headers(server_cfg: dict[str, Any]) -> dict[str, str]:
    """`Authorization: Bearer KEY` when an API key is configured, else no header."""
    key = api_key(server_cfg)
    return {"Authorization": f"Bearer {key}"} if key else {}


def tls_verify(server_cfg: dict[str, Any]) -> bool | str:
    """What `requests` verifies an https server with: `server.ca_bundle` (a PEM file) when set, else
    the system's trust store (True)."""
    return server_cfg.get("ca_bundle") or True
