"""Is the server up and the expected one: GET /health, the wait for it, and /v1/models. Its own module
because the lifecycle (start, wait), both backends and the SSH tunnel (whose health is polled through
it) ask, and the lifecycle opens tunnels."""

from __future__ import annotations

import time
from collections.abc import Callable

import requests

from eagle3_pipeline import secrets


class ServerError(RuntimeError):
    """The server did not come up (or is not the expected one); the message carries the log tail."""


def check_health(
    base_url: str, headers: dict[str, str] | None = None, timeout_s: float = 5, verify: bool | str = True
) -> bool:
    """True when GET /health answers 200 (`verify`: server.ca_bundle for https, see `tls_verify`)."""
    try:
        response = requests.get(f"{base_url}/health", headers=headers or {}, timeout=timeout_s, verify=verify)
    except requests.RequestException:
        return False
    return response.status_code == 200


def wait_healthy(
    base_url: str,
    timeout_s: float,
    log_tail: Callable[[], str] | None = None,
    alive: Callable[[], bool] | None = None,
    headers: dict[str, str] | None = None,
    exited_why: Callable[[], str] | None = None,
    verify: bool | str = True,
) -> None:
    """Poll /health until it answers 200; raise ServerError with the log tail on timeout or as soon as
    `alive` (the local process, or the unit's state polled beside /health) says it is gone. `verify`:
    what an https server is verified with (server.ca_bundle, see `tls_verify`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check_health(base_url, headers, verify=verify):
            return
        exited = alive is not None and not alive()
        if exited or time.monotonic() >= deadline:
            if exited:
                why = exited_why() if exited_why else "the server process exited"
            else:
                why = f"no healthy /health within {timeout_s:g} s"
            tail_text = log_tail() if log_tail else ""
            raise ServerError(f"{base_url}: {why}. Last lines of the server log:\n{tail_text or '(empty)'}")
        time.sleep(1)


def check_model(
    base_url: str, served_model_name: str, headers: dict[str, str] | None = None, verify: bool | str = True
) -> None:
    """Raise ServerError unless /v1/models lists served_model_name."""
    try:
        resp = requests.get(f"{base_url}/v1/models", headers=headers or {}, timeout=30, verify=verify)
        resp.raise_for_status()
        ids = [m.get("id") for m in resp.json().get("data", [])]
    except (requests.RequestException, ValueError) as err:
        raise ServerError(f"{base_url}/v1/models failed: {secrets.REDACTOR.scrub(str(err))}") from None
    if served_model_name not in ids:
        raise ServerError(
            f"{base_url} serves {ids}, not {served_model_name!r} from the snapshot: another server holds the "
            "port, or the unit changed since the snapshot (rerun snapshot_server)"
        )
