"""The extraction engine's health (issue 37, item 4), on the real serving loop (engine_loop.Server) with
an engine and a reader that stand in for vLLM's: back-pressure (nothing admitted while the writer is
behind), the watchdog (a dead writer, a stuck model step: failed.json names the stage and a waiting
client fails at once with it), and a dropped client's requests cancelled (a cancel mark, a dead pid).
The same loop runs on a real vLLM CPU engine in tests/integration/test_extraction_engine.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from eagle3_pipeline import io
from eagle3_pipeline.hidden_states import engine, engine_health
from eagle3_pipeline.hidden_states.engine_loop import Server

H = 4  # hidden size of the states the reader returns


class Output:
    """What vLLM's LLMEngine.step returns for a finished request."""

    def __init__(self, request_id: str) -> None:
        self.request_id, self.finished, self.kv_transfer_params = request_id, True, {}


class Engine:
    """LLMEngine's calls the loop makes; `hold` keeps requests in the engine, `gate` blocks a step."""

    def __init__(self) -> None:
        self.waiting: list[str] = []
        self.added: list[str] = []
        self.aborted: list[str] = []
        self.hold = threading.Event()
        self.gate = threading.Event()
        self.gate.set()

    def add_request(self, rid: str, prompt: Any, params: Any) -> None:
        self.waiting.append(rid)
        self.added.append(rid)

    def step(self) -> list[Output]:
        self.gate.wait()
        if self.hold.is_set():
            time.sleep(0.01)
            return []
        done, self.waiting = self.waiting, []
        return [Output(rid) for rid in done]

    def abort_request(self, ids: list[str]) -> None:
        self.aborted += ids
        self.waiting = [rid for rid in self.waiting if rid not in ids]


class Reader:
    """Finisher's reading side: zeros of the right shape; `gate` holds the writer back."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.discarded: list[str] = []

    def states(self, output: Output, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        self.gate.wait()
        return torch.zeros(len(ids), 3 * H), torch.zeros(len(ids), H)

    def discard(self, output: Output) -> None:
        self.discarded.append(output.request_id)


class Loop:
    """A Server serving in a thread; stalls are recorded instead of killing this process."""

    def __init__(self, directory: Path, window: int, stall_s: float = 60.0) -> None:
        self.directory = directory
        for folder in ("queue", "done", engine_health.CANCEL_DIR):
            (directory / folder).mkdir(parents=True, exist_ok=True)
        spec = {
            "max_in_flight_tokens": window,
            "idle_timeout_s": 60,
            "stall_timeout_s": stall_s,
            "start_id": "s1",
            "staging_dir": str(directory / "staging"),
        }
        self.server = Server(directory, spec)
        self.server.prompt = lambda ids: ids
        self.stalls: list[tuple[str, str]] = []
        self.server.abort = lambda: self.stalls.append(self.recorded())
        self.engine, self.reader = Engine(), Reader()
        self.thread = threading.Thread(
            target=self.server.serve_loop, args=(self.engine, self.reader, None, {}), daemon=True
        )

    def recorded(self) -> tuple[str, str]:
        failure = engine_health.read_failure(self.directory, "s1")
        assert failure, "failed.json is written before the engine stops itself"
        return failure["stage"], failure["error"]

    def request(self, name: str, lengths: list[int], client: dict[str, Any] | None = None) -> str:
        batches = [
            {"part": str(self.directory / f"{name}-{b}.safetensors"), "index": [b], "input_ids": [[1] * n]}
            for b, n in enumerate(lengths)
        ]
        data = {"name": name, "batches": batches, "client": client or engine_health.client_record()}
        io.write_json(data, self.directory / "queue" / f"{name}.json")  # atomic, as engine.enqueue
        return name

    def stop(self) -> None:
        self.engine.hold.clear()
        self.engine.gate.set()
        self.reader.gate.set()
        (self.directory / "stop").touch()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def _until(condition: Any, timeout: float = 60.0) -> None:  # a loaded CI runner: returns as soon as true
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _done(directory: Path, name: str) -> dict[str, Any] | None:
    path = directory / "done" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_the_engine_admits_nothing_while_the_writer_is_behind(tmp_path):
    loop = Loop(tmp_path, window=8)
    loop.reader.gate.clear()  # the writer cannot read any state
    loop.thread.start()
    loop.request("r", [4] * 6)
    _until(lambda: len(loop.engine.added) == 2)
    time.sleep(0.3)  # the engine keeps looping: still nothing more admitted
    window = loop.server.flight
    assert len(loop.engine.added) == 2 and window.in_engine == 0 and window.staged == 8
    loop.reader.gate.set()  # the writer catches up: the rest runs, never more than the window held
    _until(lambda: _done(tmp_path, "r") is not None)
    assert _done(tmp_path, "r")["ok"] and len(loop.engine.added) == 6
    assert window.staged == 0 and window.in_engine == 0
    loop.stop()


def test_a_dead_writer_stops_the_engine_and_its_client_fails_at_once_naming_it(tmp_path, monkeypatch):
    loop = Loop(tmp_path, window=8, stall_s=0.4)

    def disk_full(request: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(loop.server, "_done", disk_full)  # the writer's last act for a request
    loop.thread.start()
    name = loop.request("r", [4])
    _until(lambda: loop.stalls)
    stage, error = loop.stalls[0]
    assert stage == "writer" and "the writer thread died (OSError" in error and "No space left" in error
    # the client: its engine alive (heartbeat), no done file; fails with the stage, not after 900 s
    info = {"start_id": "s1", "pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time()}
    (tmp_path / "process.json").write_text(json.dumps(info))
    (tmp_path / "heartbeat").touch()
    start = time.monotonic()
    with pytest.raises(engine.EngineError, match=r"stopped itself: its writer made no progress: the writer"):
        engine.wait_done(tmp_path, info, name)
    assert time.monotonic() - start < 5
    loop.stop()


def test_a_stuck_model_step_stops_the_engine_naming_it(tmp_path):
    loop = Loop(tmp_path, window=8, stall_s=0.4)
    loop.engine.gate.clear()  # the step never returns
    loop.thread.start()
    loop.request("r", [4])
    _until(lambda: loop.stalls)
    stage, error = loop.stalls[0]
    assert stage == "model step" and "1 requests in the engine" in error
    loop.stop()


def test_a_cancelled_request_is_dropped_and_its_sequences_in_the_engine_aborted(tmp_path):
    loop = Loop(tmp_path, window=4)
    loop.engine.hold.set()  # requests stay in the engine until released
    loop.thread.start()
    loop.request("gone", [4] * 5)
    _until(lambda: len(loop.engine.added) == 1)
    engine_health.request_cancel(tmp_path, "gone")  # its client stopped
    _until(lambda: loop.engine.aborted)
    assert loop.engine.aborted == ["gone-0-0"] and len(loop.engine.added) == 1  # 4 never sent
    assert loop.server.flight.in_engine == 0 and not loop.server.pending
    assert not (tmp_path / engine_health.CANCEL_DIR / "gone").exists()
    loop.engine.hold.clear()
    loop.request("next", [4, 4])  # the engine goes on with the other clients
    _until(lambda: _done(tmp_path, "next") is not None)
    assert _done(tmp_path, "gone") is None and loop.server.stats()["cancelled"] == 1
    loop.stop()


def test_the_requests_of_a_dead_client_are_never_run(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid names no process
    loop = Loop(tmp_path, window=4)
    loop.thread.start()
    loop.request("orphan", [4] * 3, client={"host": socket.gethostname(), "pid": dead.pid})
    _until(lambda: loop.server.cancelled == 1)
    assert loop.engine.added == [] and _done(tmp_path, "orphan") is None
    loop.stop()


def test_a_client_stopped_by_sigterm_cancels_its_request(tmp_path):
    (tmp_path / "queue").mkdir()
    name = engine.enqueue(tmp_path, {"batches": []})
    info = {"start_id": "s1", "pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time()}
    (tmp_path / "process.json").write_text(json.dumps(info))
    (tmp_path / "heartbeat").touch()
    (tmp_path / "ready.json").write_text(json.dumps({"start_id": "s1"}))
    before = signal.getsignal(signal.SIGTERM)
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()  # as Snakemake stops a job
    with pytest.raises(SystemExit):
        engine.wait_or_cancel(tmp_path, info, name)
    assert (tmp_path / engine_health.CANCEL_DIR / name).exists()
    assert not (tmp_path / "queue" / f"{name}.json").exists()  # not taken yet: unqueued
    assert signal.getsignal(signal.SIGTERM) is before  # the client's own handler back


def test_the_watchdog_rules():
    base = engine_health.Health(True, "", 0.0, 0, 0, 0.0)
    assert engine_health.stalled(base, 1000.0, 10) is None
    stepping = engine_health.Health(True, "", 995.0, 3, 0, 0.0)
    assert engine_health.stalled(stepping, 1000.0, 10) is None  # a step of 5 s is no stall
    assert engine_health.stalled(stepping, 1006.0, 10)[0] == "model step"
    staged = engine_health.Health(True, "", 0.0, 0, 2, 980.0)
    assert engine_health.stalled(staged, 1000.0, 10)[0] == "writer"
    dead = engine_health.Health(False, "RuntimeError: boom", 0.0, 0, 0, 0.0)
    assert engine_health.stalled(dead, 1000.0, 10) == (
        "writer",
        "the writer thread died (RuntimeError: boom)",
    )


def test_the_stop_report_of_an_engine_its_watchdog_stopped_names_the_stage(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    info = {"start_id": "s1", "pid": gone.pid, "host": socket.gethostname(), "started_at": time.time()}
    (tmp_path / "process.json").write_text(json.dumps(info))
    engine_health.record_failure(tmp_path, "s1", "model step", "an engine step has not returned for 301 s")
    report = engine.stop_engine(tmp_path)
    assert report["stopped"] == "already exited" and report["failed"]["stage"] == "model step"
