"""The extraction engine's health: a progress watchdog, back-pressure on staged states, and the
cancellation of a dropped client's requests (issue 37, item 4).

- Back-pressure (`InFlightTokens`): the engine's bound on tokens in flight counts the tokens in the
  engine AND the tokens staged (finished by vLLM, their states in a staging file the writer thread has
  not read yet); a request stays in flight until the writer has read its states, so while the writer
  is behind the engine admits nothing new and the staging folder never holds more than the bound.
- Watchdog (`stalled`, `Watchdog`): while requests are outstanding, engine steps must return and the
  writer must read staged states within `stall_timeout_s`, and the writer thread must be alive; else
  the engine records the stuck stage in `failed.json` and stops itself, and every client waiting on
  it fails at once with that message (`read_failure`, engine.wait_done) instead of waiting out the
  idle timeout.
- Cancel (`request_cancel`, `dropped`): a client stopped by a signal writes `cancel/NAME`; a client
  killed outright is noticed by its pid (same host). Either way the engine drops the request's queued
  sequences and aborts those in the engine, so its rerun computes none of them twice.

Pure Python (no vLLM, no torch): the engine (vllm_worker.py) and its clients (engine.py) share it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline import io
from eagle3_pipeline.server.process_identity import pid_alive

log = logging.getLogger(__name__)

FAILED_FILE = "failed.json"  # the stuck stage, written by the engine that stopped itself
CANCEL_DIR = "cancel"  # cancel/NAME: the client of request NAME gave up on it
# a model step of the in-flight tokens (two steps of up to max_num_batched_tokens) takes seconds even for a 1T
# MoE; a writer reads one request's states in well under that: minutes without either is a hang
STALL_TIMEOUT_S = 300.0
WATCH_S = 1.0  # how often the watchdog looks


class InFlightTokens:
    """Tokens held by the engine: in vLLM plus staged, bounded together by `limit` (thread-safe).

    The engine loop calls `add` (a sequence sent to vLLM), `finish` (vLLM returned it: its states are
    staged for the writer) or `drop` (aborted); the writer calls `taken` once it has read the states.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_engine = self.staged = 0
        self.staged_requests = 0
        self.waiting_since = 0.0  # monotonic: the writer's last read, or the first state staged since
        self._lock = threading.Lock()

    def admits(self, tokens: int) -> bool:
        """A sequence of `tokens` fits (one always does when nothing is held: a long one runs alone)."""
        with self._lock:
            held = self.in_engine + self.staged
            return held == 0 or held + tokens <= self.limit

    def add(self, tokens: int) -> None:
        with self._lock:
            self.in_engine += tokens

    def drop(self, tokens: int) -> None:
        with self._lock:
            self.in_engine -= tokens

    def finish(self, tokens: int) -> None:
        with self._lock:
            if not self.staged_requests:
                self.waiting_since = time.monotonic()  # the writer's clock starts now
            self.in_engine -= tokens
            self.staged += tokens
            self.staged_requests += 1

    def taken(self, tokens: int) -> None:
        with self._lock:
            self.staged -= tokens
            self.staged_requests -= 1
            self.waiting_since = time.monotonic()


@dataclass(frozen=True)
class Health:
    """What the watchdog reads: a snapshot of the engine loop and its writer."""

    writer_alive: bool
    writer_error: str  # why the writer thread died ("" while it runs)
    step_started: float  # monotonic start of the engine step in progress, 0 when none
    in_engine: int  # requests in vLLM
    staged: int  # requests finished by vLLM, their states not read yet
    waiting_since: float  # monotonic: the writer's last read (or the first state staged since)


def stalled(health: Health, now: float, stall_s: float) -> tuple[str, str] | None:
    """(stage, message) of the stage that stopped progressing, or None while the engine progresses."""
    if not health.writer_alive:
        return "writer", f"the writer thread died ({health.writer_error or 'no error recorded'})"
    if health.step_started and now - health.step_started > stall_s:
        return "model step", (
            f"an engine step has not returned for {now - health.step_started:.0f} s with "
            f"{health.in_engine} requests in the engine (hidden_states.vllm: the model is stuck)"
        )
    if health.staged and now - health.waiting_since > stall_s:
        return "writer", (
            f"the writer has read no staged state for {now - health.waiting_since:.0f} s "
            f"({health.staged} requests staged)"
        )
    return None


class Watchdog(threading.Thread):
    """Calls `on_stall(stage, message)` once when `stalled` says a stage stopped progressing."""

    def __init__(
        self, health: Callable[[], Health], on_stall: Callable[[str, str], None], stall_s: float
    ) -> None:
        super().__init__(name="extraction-watchdog", daemon=True)
        self.health, self.on_stall, self.stall_s = health, on_stall, stall_s
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(min(WATCH_S, self.stall_s / 4)):
            found = stalled(self.health(), time.monotonic(), self.stall_s)
            if found:
                self.on_stall(*found)
                return


def record_failure(directory: Path, start_id: str, stage: str, message: str, kind: str = "stall") -> None:
    """failed.json: the stage that stopped the engine `start_id`, for its clients; `kind` is `stall` (its
    watchdog found the stage making no progress) or `error` (the stage raised after the model loaded)."""
    failure = {"start_id": start_id, "stage": stage, "kind": kind, "error": message, "at": time.time()}
    io.write_json(failure, Path(directory) / FAILED_FILE, indent=None)


def describe_failure(failure: dict[str, Any]) -> str:
    """What failed.json says, in words: `the extraction engine ID ...`."""
    head = f"the extraction engine {failure['start_id']}"
    if failure.get("kind") == "error":
        return f"{head} failed after its model loaded, in its {failure['stage']}: {failure['error']}"
    return f"{head} stopped itself: its {failure['stage']} made no progress: {failure['error']}"


def read_failure(directory: Path, start_id: str) -> dict[str, Any] | None:
    """The failure the engine `start_id` recorded before stopping itself, if any."""
    try:
        failure = json.loads((Path(directory) / FAILED_FILE).read_text())
    except (OSError, ValueError):
        return None
    return failure if failure.get("start_id") == start_id else None


def client_record() -> dict[str, Any]:
    """Who sent a request: the engine drops the request once this process is gone."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def request_cancel(directory: Path, name: str) -> None:
    """The client gives up on request `name`: a cancel mark, and the request unqueued if not yet taken."""
    io.write_text("", Path(directory) / CANCEL_DIR / name)
    (Path(directory) / "queue" / f"{name}.json").unlink(missing_ok=True)


def dropped(directory: Path, name: str, client: dict[str, Any] | None) -> str | None:
    """Why request `name` has no client any more (a cancel mark, or its process gone), else None.
    A client on another host is known by its cancel mark only."""
    if (Path(directory) / CANCEL_DIR / name).exists():
        return "its client cancelled it"
    if client and client.get("host") == socket.gethostname() and not pid_alive(int(client["pid"])):
        return f"its client (pid {client['pid']}) is gone"
    return None
