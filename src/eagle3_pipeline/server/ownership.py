"""Who started the server: `ownership.json` in the state folder says whether the pipeline did
(`started_by_pipeline`) and which start it was (systemd's InvocationID, or the local pid), so that
after generation only a server the pipeline started, and still that start, is stopped (unless
`server.stop_foreign`): a server that was already serving users stays up. It is written BEFORE a
start is sent (`pending`, with `invocation_before`), so a job that dies or loses its link while the
start is under way still leaves a record the next job can resolve. A file lock beside it makes
parallel jobs start the server exactly once."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagle3_pipeline import io
from eagle3_pipeline.settings import ServerSettings

log = logging.getLogger(__name__)
OWNERSHIP_FILE = "ownership.json"


@contextlib.contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """An exclusive lock on state_dir/lifecycle.lock, shared by all jobs using this server."""
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(state_dir) / "lifecycle.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_ownership(state_dir: Path) -> dict[str, Any] | None:
    """The ownership record; None when nothing is recorded."""
    try:
        return json.loads((Path(state_dir) / OWNERSHIP_FILE).read_text())
    except (OSError, ValueError):
        return None


def record_ownership(
    state_dir: Path, started_by_pipeline: bool, server: ServerSettings, **extra: Any
) -> None:
    """Write ownership.json atomically (under the state lock)."""
    record = {
        "started_by_pipeline": started_by_pipeline,
        "unit": server.unit,
        "host": server.host,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **extra,
    }
    io.write_json(record, Path(state_dir) / OWNERSHIP_FILE, indent=2, sort_keys=True)
    log.info("ownership of %s: %s", server.unit, "started by the pipeline" if started_by_pipeline else
             "already running, not started by the pipeline: it will be left running")  # fmt: skip


def clear_ownership(state_dir: Path) -> None:
    """Forget the record: the server it describes was stopped."""
    (Path(state_dir) / OWNERSHIP_FILE).unlink(missing_ok=True)
