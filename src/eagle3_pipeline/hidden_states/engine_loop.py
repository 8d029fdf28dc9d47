"""The extraction engine's serving loop, inside the engine process (vllm_worker.serve runs it).

The engine never drains: requests stream into vLLM's LLMEngine under a bound on the tokens in flight
(`max_in_flight_tokens`: in the engine plus staged, engine_health.InFlightTokens) while a writer thread
reads each finished request's states, applies the final norm and writes each batch's part as soon as
its last request is back; the engine core (its own process) keeps stepping the next requests
meanwhile. A request stays in flight until the writer has read its states (back-pressure), a
watchdog stops the engine when its steps or its writer stop progressing (failed.json names the stage),
and the requests of a client that is gone are dropped (engine_health.py). The former loop (one
`LLM.generate` per batch, then reading and writing with the engine idle) is benchmarks/drain_engine.py,
the benchmark's "before".

vLLM is imported only where it is called (`Server.run`, reading a staged file), so
the loop runs in tests with an engine that stands in for vLLM's (tests/unit/test_extraction_engine_health.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import shutil
import signal
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from eagle3_pipeline import io
from eagle3_pipeline.hidden_states import engine_health, final_norm, storage

log = logging.getLogger("eagle3_pipeline.hidden_states.vllm_worker")  # the engine's log, as before
IDLE_POLL_S = 0.005  # with nothing in the engine: how often queue/ is read (a request waits at most this)
CANCEL_POLL_S = 0.5  # how often the open requests' clients are checked (a cancel mark, a pid gone)
# the vLLM names this loop uses (vllm_compat.py checks them in every supported release's wheel)
VLLM_NAMES = (
    (
        "name",
        "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector",
        "load_hidden_states",
    ),
    (
        "name",
        "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector",
        "cleanup_hidden_states",
    ),
    ("literal", "vllm/distributed/kv_transfer/kv_connector/v1/", "hidden_states_path"),
    ("name", "vllm", "SamplingParams"),
    ("member", "vllm.sampling_params", "SamplingParams.max_tokens"),
    ("member", "vllm.sampling_params", "SamplingParams.temperature"),
    ("name", "vllm", "TokensPrompt"),
    ("key", "vllm/inputs/", "prompt_token_ids"),
    ("member", "vllm.entrypoints.llm", "LLM.llm_engine"),
    ("member", "vllm.v1.engine.llm_engine", "LLMEngine.add_request"),
    ("member", "vllm.v1.engine.llm_engine", "LLMEngine.abort_request"),
    ("member", "vllm.v1.engine.llm_engine", "LLMEngine.step"),
    ("member", "vllm.outputs", "RequestOutput.request_id"),
    ("member", "vllm.outputs", "RequestOutput.finished"),
    ("member", "vllm.outputs", "RequestOutput.kv_transfer_params"),
)


class WorkerError(RuntimeError):
    """The engine could not run the job; the message names the fix."""


def read_states(output: Any, ids: list[int]) -> torch.Tensor:
    """[tokens, len(layer_ids), H] states of one request, once its file is written (flock wait)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        cleanup_hidden_states,
        load_hidden_states,
    )

    path = (output.kv_transfer_params or {}).get("hidden_states_path")
    if not path:
        raise WorkerError(f"request {output.request_id}: the engine returned no hidden_states_path")
    data = load_hidden_states(path)
    cleanup_hidden_states(path)
    if data["token_ids"].tolist() != ids or data["hidden_states"].shape[0] != len(ids):
        raise WorkerError(
            f"request {output.request_id}: the engine's states cover {data['token_ids'].shape[0]} tokens "
            f"that differ from the {len(ids)} sent"
        )
    return data["hidden_states"]


class Finisher:
    """Turns finished requests into states, and complete batches into parts (the writer thread's work)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        norm = final_norm.FinalNorm(**spec["final_norm"])
        self.weight, self.eps = final_norm.load_weight(norm), norm.eps
        self.dtype = storage.TORCH_DTYPES[spec["storage_dtype"]]

    def states(self, output: Any, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(aux [T, 3H], final [T, H] post-norm) of one finished request."""
        states = read_states(output, ids)
        tokens, _, hidden = states.shape
        aux = states[:, :3].reshape(tokens, 3 * hidden).to(self.dtype)
        return aux, final_norm.rms_norm(states[:, 3], self.weight, self.eps).to(self.dtype)

    @staticmethod
    def discard(output: Any) -> None:
        """Delete a finished request's staging file unread (its request failed or was cancelled)."""
        path = (output.kv_transfer_params or {}).get("hidden_states_path")
        if path:
            from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
                cleanup_hidden_states,
            )

            cleanup_hidden_states(path)

    @staticmethod
    def write_part(batch: dict[str, Any], pieces: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
        tensors = {
            "index": torch.tensor(batch["index"], dtype=torch.int64),
            "aux_hidden_states": torch.cat([aux for aux, _ in pieces]),
            "final_hidden_states": torch.cat([final for _, final in pieces]),
        }
        io.write_safetensors(tensors, Path(batch["part"]))
        return int(tensors["aux_hidden_states"].shape[0])


class Request:
    """One client job's batches, as they come back."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.name: str = data["name"]
        self.batches: list[dict[str, Any]] = data["batches"]
        self.records: list[str] = data.get("records", [])
        self.pieces: list[list[Any]] = [[None] * len(b["input_ids"]) for b in self.batches]
        self.missing = [len(b["input_ids"]) for b in self.batches]
        self.open_batches = sum(1 for n in self.missing if n)
        self.tokens, self.error = 0, ""
        self.client: dict[str, Any] | None = data.get("client")  # engine_health.client_record
        self.cancelled = ""  # why its client is gone: its remaining sequences are dropped
        self.started = time.time()
        self.queued = float(data.get("queued_at") or self.started)  # its file's time in queue/


class Server:
    """The engine's loop: take requests from queue/, keep the engine fed, write parts and done files."""

    def __init__(self, directory: Path, spec: dict[str, Any]) -> None:
        self.directory, self.spec = directory, spec
        self.flight = engine_health.InFlightTokens(int(spec["max_in_flight_tokens"]))
        self.idle_timeout = float(spec["idle_timeout_s"])
        self.stall_s = float(spec.get("stall_timeout_s") or engine_health.STALL_TIMEOUT_S)
        self.pending: deque[tuple[Request, int, int]] = deque()  # (request, batch, sequence) to add
        self.in_flight: dict[str, tuple[Request, int, int, int]] = {}  # vLLM id -> (.., tokens)
        self.open_requests: dict[str, Request] = {}  # requests taken and not done: their clients are watched
        # to the writer thread; bounded by self.flight (a sequence leaves it once the writer read it)
        self.finished: queue.Queue[Any] = queue.Queue()
        self.writer: threading.Thread | None = None
        self.writer_error = ""
        self.step_started = 0.0  # monotonic start of the engine step in progress (0: none)
        self.cancel_checked = 0.0
        self.cancelled = 0  # requests dropped because their client was gone
        self.prompt: Any = None  # ids -> the engine's prompt (vLLM's TokensPrompt; set by run)
        self.abort = _kill_own_session  # what a stall does once recorded (tests replace it)
        self.busy_s = 0.0  # time in engine steps (engine.step() with requests in the engine)
        self.loop_s = 0.0  # this loop's own time while requests were in the engine (take, fill)
        self.tokens = 0
        self.requests = 0
        # perf_counter marks: engine ready, first request taken, last engine step, last request done
        self.ready_at = self.first_request = self.last_step = self.last_done = 0.0
        self.ready_wall = 0.0  # time.time() at ready: the timeline's zero
        # every request answered: queued, taken and done, in seconds from the engine ready (queued
        # before the engine was ready: negative); where the engine waited for its clients
        self.timeline: list[dict[str, Any]] = []

    def _queued(self) -> list[tuple[float, Path]]:
        """queue/'s requests, oldest first (one its client unqueued meanwhile is skipped)."""
        found = []
        for path in (self.directory / "queue").glob("*.json"):
            with contextlib.suppress(FileNotFoundError):
                found.append((path.stat().st_mtime, path))
        return sorted(found)

    def _take_requests(self, record: dict[str, Any]) -> None:
        for queued, path in self._queued():
            try:
                data = json.loads(path.read_text())
                path.unlink()
            except FileNotFoundError:  # cancelled by its client (engine_health.request_cancel)
                continue
            request = Request({**data, "queued_at": queued})
            why = engine_health.dropped(self.directory, request.name, request.client)
            if why:  # its client gone before it ran: nothing of it is sent
                log.info("request %s dropped before it ran (%s)", request.name, why)
                self._forget(request, why)
                continue
            self.open_requests[request.name] = request
            self.first_request = self.first_request or time.perf_counter()
            for target in request.records:
                storage.write_json(record, Path(target))
            log.info("request %s: %d batches", request.name, len(request.batches))
            self._accept(request)

    def _accept(self, request: Request) -> None:
        if not request.open_batches:
            self._done(request)
        for b, batch in enumerate(request.batches):
            self.pending.extend((request, b, i) for i in range(len(batch["input_ids"])))

    def _done(self, request: Request) -> None:
        self.open_requests.pop(request.name, None)
        if request.cancelled:
            return  # no client waits for it
        elapsed = round(time.time() - request.started, 2)
        result = {"ok": not request.error, "error": request.error, "tokens": request.tokens, "s": elapsed}
        for target in request.records:
            path = Path(target)
            if path.exists():
                data = json.loads(path.read_text())
                data["last_run"] = {
                    "batches": len(request.batches),
                    "tokens": request.tokens,
                    "extract_s": elapsed,
                }
                storage.write_json(data, path)
        io.write_json(result, self.directory / "done" / f"{request.name}.json", indent=None)
        self.requests += 1
        self.last_done = time.perf_counter()
        zero = self.ready_wall or request.started
        self.timeline.append(
            {
                "name": request.name,
                "tokens": request.tokens,
                "queued_s": round(request.queued - zero, 3),
                "taken_s": round(request.started - zero, 3),
                "done_s": round(time.time() - zero, 3),
            }
        )

    def _write_loop(self, finisher: Finisher) -> None:
        """The writer thread: its death is recorded for the watchdog, which stops the engine."""
        try:
            self._writer(finisher)
        except BaseException as err:
            self.writer_error = f"{type(err).__name__}: {err}"
            log.exception("the writer thread died")

    def _read(self, finisher: Finisher, request: Request, b: int, i: int, output: Any) -> None:
        """One finished sequence's states read (or discarded), its staging file gone either way."""
        try:
            if request.error or request.cancelled:
                finisher.discard(output)
            else:
                request.pieces[b][i] = finisher.states(output, request.batches[b]["input_ids"][i])
        except Exception as err:  # a request's own failure: its client fails, the engine goes on
            request.error = request.error or f"{type(err).__name__}: {err}"

    def _writer(self, finisher: Finisher) -> None:
        while True:
            item = self.finished.get()
            if item is None:
                return
            request, b, i, output, tokens = item
            batch = request.batches[b]
            self._read(finisher, request, b, i, output)
            self.flight.taken(tokens)  # read: no longer in flight, the engine may admit more
            if request.cancelled:
                continue
            request.missing[b] -= 1
            if request.missing[b] == 0:
                try:
                    if not request.error:
                        request.tokens += Finisher.write_part(batch, request.pieces[b])
                except Exception as err:
                    request.error = f"{type(err).__name__}: {err}"
                request.pieces[b] = []
                request.open_batches -= 1
                if request.open_batches == 0:
                    self.tokens += request.tokens
                    self._done(request)

    def _fill(self, engine: Any, params: Any) -> None:
        while self.pending:
            request, b, i = self.pending[0]
            ids = request.batches[b]["input_ids"][i]
            if not self.flight.admits(len(ids)):  # the engine full, or the writer behind
                return
            self.pending.popleft()
            rid = f"{request.name}-{b}-{i}"  # outputs carry this id (vLLM suffixes its internal one)
            engine.add_request(rid, self.prompt(ids), params)
            self.in_flight[rid] = (request, b, i, len(ids))
            self.flight.add(len(ids))

    def _cancel_dropped(self, engine: Any) -> None:
        """Drop the requests whose client is gone (a cancel mark, or its process dead)."""
        if time.monotonic() - self.cancel_checked < CANCEL_POLL_S:
            return
        self.cancel_checked = time.monotonic()
        for request in list(self.open_requests.values()):
            why = engine_health.dropped(self.directory, request.name, request.client)
            if why:
                self._cancel(engine, request, why)

    def _forget(self, request: Request, why: str) -> None:
        """A request whose client is gone: no done file, its cancel mark removed, counted."""
        request.cancelled = why
        self.open_requests.pop(request.name, None)
        (self.directory / engine_health.CANCEL_DIR / request.name).unlink(missing_ok=True)
        self.cancelled += 1

    def _cancel(self, engine: Any, request: Request, why: str) -> None:
        unsent = sum(1 for item in self.pending if item[0] is request)
        self.pending = deque(item for item in self.pending if item[0] is not request)
        aborted = [rid for rid, entry in self.in_flight.items() if entry[0] is request]
        if aborted:
            engine.abort_request(aborted)
        for rid in aborted:
            self.flight.drop(self.in_flight.pop(rid)[3])
        self._forget(request, why)
        log.info(
            "request %s dropped (%s): %d sequences unsent, %d aborted in the engine; its saved parts stay",
            request.name, why, unsent, len(aborted),
        )  # fmt: skip

    def health(self) -> engine_health.Health:
        return engine_health.Health(
            writer_alive=bool(self.writer and self.writer.is_alive()),
            writer_error=self.writer_error,
            step_started=self.step_started,
            in_engine=len(self.in_flight),
            staged=self.flight.staged_requests,
            waiting_since=self.flight.waiting_since,
        )

    def _on_stall(self, stage: str, message: str) -> None:
        """A stage stopped progressing: recorded for the clients (failed.json), then the engine stops."""
        log.error("the extraction engine is stuck at its %s: %s; stopping it", stage, message)
        engine_health.record_failure(self.directory, self.spec["start_id"], stage, message)
        io.write_json(self.stats(), self.directory / "stats.json", indent=None)
        shutil.rmtree(self.spec["staging_dir"], ignore_errors=True)
        self.abort()

    def stats(self) -> dict[str, Any]:
        """busy_fraction = time in engine steps / wall from the engine ready to the last request done
        (the idle time up to the stop, when no client has work, is not the engine's to fill); where
        the rest went: before the first request, this loop's own time with requests in the engine,
        the tail after the last step (the last parts read and written), and the engine empty between
        (waiting for a client's request)."""
        done = self.last_done or self.ready_at
        since_ready, working = done - self.ready_at, done - (self.first_request or done)
        first_wait = (self.first_request or done) - self.ready_at
        tail = max(done - self.last_step, 0.0) if self.last_step else 0.0
        return {
            "busy_s": round(self.busy_s, 3),
            "ready_to_done_s": round(since_ready, 3),
            "busy_fraction": round(self.busy_s / since_ready, 4) if since_ready > 0 else None,
            # from the first request taken to the last one answered (the clients' start not counted)
            "working_s": round(working, 3),
            "busy_fraction_working": round(self.busy_s / working, 4) if working > 0 else None,
            "idle_s": {
                "before_first_request": round(first_wait, 3),
                "loop": round(self.loop_s, 3),
                "tail": round(tail, 3),
                "engine_empty": round(
                    max(since_ready - self.busy_s - self.loop_s - first_wait - tail, 0.0), 3
                ),
            },
            "wall_s": round(time.perf_counter() - self.ready_at, 3),  # ready to now (the exit)
            "tokens": self.tokens,
            "requests": self.requests,
            "cancelled": self.cancelled,
            "timeline": list(self.timeline),  # appended by the writer thread
        }

    def run(self, llm: Any, record: dict[str, Any]) -> None:
        from vllm import SamplingParams, TokensPrompt

        self.prompt = lambda ids: TokensPrompt(prompt_token_ids=ids)
        params = SamplingParams(max_tokens=1, temperature=0.0)
        self.serve_loop(llm.llm_engine, Finisher(self.spec), params, record)

    def _step(self, engine: Any, loop_start: float) -> None:
        start = time.perf_counter()
        self.loop_s += start - loop_start
        self.step_started = time.monotonic()
        outputs = engine.step()  # waits for the engine core, which steps on its own meanwhile
        self.step_started = 0.0
        self.last_step = time.perf_counter()
        self.busy_s += self.last_step - start
        for output in outputs:
            if output.finished and output.request_id in self.in_flight:
                request, b, i, tokens = self.in_flight.pop(output.request_id)
                self.flight.finish(tokens)  # staged: still in flight until the writer reads it
                self.finished.put((request, b, i, output, tokens))

    def serve_loop(self, engine: Any, finisher: Any, params: Any, record: dict[str, Any]) -> None:
        """Serve until stopped or idle: `engine` is vLLM's LLMEngine (add_request, step, abort_request)."""
        self.writer = threading.Thread(target=self._write_loop, args=(finisher,), daemon=True)
        self.writer.start()
        watchdog = engine_health.Watchdog(self.health, self._on_stall, self.stall_s)
        watchdog.start()
        self.ready_at = last_work = time.perf_counter()
        self.ready_wall = time.time()
        stats_at = 0.0
        while True:
            loop_start = time.perf_counter()
            self._take_requests(record)  # requests queued before the engine was ready come first
            self._cancel_dropped(engine)
            self._fill(engine, params)
            if self.in_flight:
                self._step(engine, loop_start)
                last_work = self.last_step
            else:
                if self.pending or self.flight.staged_requests:
                    last_work = time.perf_counter()  # waiting for the writer is not idle
                elif (self.directory / "stop").exists() and self.finished.empty():
                    break
                if time.perf_counter() - last_work > self.idle_timeout:
                    log.info("no request for %.0f s: exiting", self.idle_timeout)
                    break
                time.sleep(IDLE_POLL_S)
            if time.perf_counter() - stats_at > 1.0:
                io.write_json(self.stats(), self.directory / "stats.json", indent=None)
                stats_at = time.perf_counter()
        watchdog.stopped.set()
        self.finished.put(None)
        self.writer.join()
        io.write_json(self.stats(), self.directory / "stats.json", indent=None)


def _kill_own_session() -> None:
    """Stop this engine at once, its vLLM processes with it: the engine is a session leader (engine.py
    starts it with start_new_session), so its process group is the engine and nothing else."""
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(4)
