"""The append-only journal of finished requests, so a killed shard resumes without loss or duplicate.

One JSON line per finished request: `{"id", "params", "result"}`. `params` is the hash of everything
that shapes the answer (model, sampling parameters, template kwargs, server identity): changing
max_tokens makes old lines stale (not reused), resuming with the same config reuses them. Each line
goes to the kernel in one `write` as soon as the request ends (a killed process loses nothing) and is
fsynced at most every `fsync_interval_s` (a power cut loses at most that much). A torn last line (a
kill mid-write) is cut off on open. A lock on the journal refuses a second writer.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FINAL = ("ok", "skipped")  # outcomes reused on resume; "failed" is retried


def params_hash(params: dict[str, Any]) -> str:
    """A short stable hash of the request parameters (key order does not matter)."""
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()


class JournalBusy(RuntimeError):
    """Another process is writing this journal (the same shard runs twice)."""


class Journal:
    """Open (creating) the journal at `path`, cut a torn tail, and load the finished results.

    Args:
        path: results/{run}/work/generations/shard-k.jsonl.
        params: the hash from params_hash(); only lines with this hash are reused.
        fsync_interval_s: seconds between fsyncs (0: fsync every line).
    """

    def __init__(self, path: str | os.PathLike[str], params: str, fsync_interval_s: float = 1.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.params = params
        self.fsync_interval_s = fsync_interval_s
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise JournalBusy(f"{self.path} is locked by another process running the same shard") from None
        self.results, self.stale = self._load()
        self._last_sync = time.monotonic()
        self._dirty = False

    def _load(self) -> tuple[dict[str, dict[str, Any]], int]:
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            log.warning("journal %s: cutting a torn last line of %d bytes", self.path, len(data) - end)
            os.ftruncate(self._fd, end)
            os.fsync(self._fd)
        results: dict[str, dict[str, Any]] = {}
        stale = 0
        for number, line in enumerate(data[:end].splitlines(), 1):
            try:
                entry = json.loads(line)
                key, params, result = entry["id"], entry["params"], entry["result"]
            except (ValueError, KeyError, TypeError):
                log.warning("journal %s line %d is unreadable; ignored", self.path, number)
                continue
            if params != self.params:
                stale += 1
            elif result.get("status") in FINAL or key not in results:
                results[key] = result  # a final outcome replaces an earlier failure
        return results, stale

    def finished(self, key: str) -> dict[str, Any] | None:
        """The reusable result for `key` (ok or skipped with the current params), else None."""
        result = self.results.get(key)
        return result if result is not None and result.get("status") in FINAL else None

    def append(self, key: str, result: dict[str, Any]) -> None:
        """Record one finished request (one write syscall; fsync at most every fsync_interval_s)."""
        line = json.dumps({"id": key, "params": self.params, "result": result}, separators=(",", ":"))
        data = memoryview(line.encode() + b"\n")
        while data:
            data = data[os.write(self._fd, data) :]
        self.results[key] = result
        self._dirty = True
        if time.monotonic() - self._last_sync >= self.fsync_interval_s:
            self.sync()

    def sync(self) -> None:
        if self._dirty:
            os.fsync(self._fd)
            self._dirty = False
        self._last_sync = time.monotonic()

    def close(self) -> None:
        if self._fd >= 0:
            self.sync()
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
