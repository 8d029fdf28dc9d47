"""Is the server up: GET /health. Its own module because both the lifecycle (start, wait, stop) and
the SSH tunnel (rebuild a tunnel that no longer reaches a healthy server) ask, and the lifecycle
opens tunnels."""

from __future__ import annotations

import requests


def check_health(
    base_url: str, headers: dict[str, str] | None = None, timeout_s: float = 5, verify: bool | str = True
) -> bool:
    """True when GET /health answers 200 (`verify`: server.ca_bundle for https, see `tls_verify`)."""
    try:
        response = requests.get(f"{base_url}/health", headers=headers or {}, timeout=timeout_s, verify=verify)
    except requests.RequestException:
        return False
    return response.status_code == 200
