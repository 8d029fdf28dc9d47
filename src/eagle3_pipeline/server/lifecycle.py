"""Starting, checking and stopping the vLLM server when the pipeline manages it (`server.manage`): the
stages' entry point to a server.

`ensure_running` finds the server healthy or starts it through its backend (backend.py: a systemd
unit, or the unit's ExecStart as a local process where there is no systemd), under a lock that makes
parallel generation shard jobs start it exactly once; `stop` stops it after generation when the
ownership record (ownership.py) says the pipeline started it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eagle3_pipeline import io, secrets
from eagle3_pipeline.server import auth_headers, tls_verify
from eagle3_pipeline.server.backend import backend_for
from eagle3_pipeline.server.health import ServerError, check_health, check_model
from eagle3_pipeline.server.ownership import read_ownership, record_ownership, state_lock
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.settings import ServerSettings

log = logging.getLogger(__name__)


def server_url(snapshot: ServerSnapshot | Mapping[str, Any], server: ServerSettings, state_dir: Path) -> str:
    """The URL requests go to: server.base_url, or through the SSH tunnel, or the snapshot's."""
    del state_dir  # the tunnel holds no state on disk
    snapshot = ServerSnapshot.of(snapshot)
    if server.base_url:
        return server.base_url.rstrip("/")
    if server.tunnel and server.host != "local":
        from eagle3_pipeline.server.tunnel import get_tunnel

        return get_tunnel(snapshot, server).url()
    return snapshot.base_url.rstrip("/")


def _record_foreign(server: ServerSettings, state_dir: Path) -> None:
    """A server found answering, with no record of ours: note that the pipeline did not start it."""
    if read_ownership(state_dir) is None:
        record_ownership(state_dir, False, server)


def ensure_running(
    snapshot: ServerSnapshot | Mapping[str, Any], server: ServerSettings, state_dir: Path
) -> str:
    """The base URL of a healthy server serving the snapshot's model, starting it when managed.

    Whoever started it, the model is checked (`/v1/models` lists served_model_name), and who started it
    is recorded in state_dir/ownership.json for `stop`.
    """
    snapshot = ServerSnapshot.of(snapshot)
    secrets.learn(snapshot)  # log tails and errors of this job hide the unit's secrets
    headers, verify = auth_headers(server), tls_verify(server)
    base_url = server_url(snapshot, server, state_dir)
    if check_health(base_url, headers, verify=verify):
        with state_lock(state_dir):
            _record_foreign(server, Path(state_dir))
    elif not server.manage:
        raise ServerError(
            f"{base_url}/health does not answer and server.manage is false: start {server.unit} "
            "yourself, or set server.manage: true"
        )
    else:
        with state_lock(state_dir):
            if check_health(base_url, headers, verify=verify):  # another job may have started it meanwhile
                _record_foreign(server, Path(state_dir))
            else:
                backend_for(server, Path(state_dir)).start(base_url, headers)
    check_model(base_url, snapshot.served_model_name, headers, verify)
    log.info("server %s is up and serves %s", base_url, snapshot.served_model_name)
    return base_url


def stop(
    snapshot: ServerSnapshot | Mapping[str, Any], server: ServerSettings, state_dir: Path
) -> dict[str, Any]:
    """Stop the server after generation when configured and ours to stop; returns what was done.

    Ours: ownership.json says the pipeline started it and (systemd) the unit's InvocationID is still
    that start's. `server.stop_foreign: true` stops it whoever started it.
    """
    secrets.learn(snapshot)  # a journal tail in an error hides the unit's secrets
    report: dict[str, Any] = {"unit": server.unit, "host": server.host}
    if not (server.manage and server.stop_after_generation):
        return {
            **report,
            "action": "left running",
            "why": "server.manage or server.stop_after_generation is off",
        }
    with state_lock(state_dir):
        owner = read_ownership(state_dir) or {}
        report["started_by_pipeline"] = bool(owner.get("started_by_pipeline"))
        return {**report, **backend_for(server, Path(state_dir)).stop(owner)}


def write_stop_report(report: dict[str, Any], path: str | Path) -> None:
    io.write_json(report, path, indent=2, sort_keys=True)
