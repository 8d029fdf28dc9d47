"""The extraction engine's lifetime: one vLLM engine serves the extraction jobs of its scope (its clients).

The engine is a Snakemake job of its own (rule serve_extraction_engine, a `service()` output): Snakemake
runs it in one group with the extraction jobs that consume it (one submission on one node on a
cluster) and terminates it once they are all done (`serve`: SIGTERM, then the engine stops). An engine
is a folder (`work/hidden_states/engine/`, or one per epoch and window under a disk cap;
`work/baseline/hidden_states/engine/` for the baseline's traces):

    lock          flock: one process starts (or stops) the engine at a time
    spec.json     what it runs (target, engine settings, layer ids, final norm, staging, tokens in flight)
    process.json  {start_id, pid, host, fingerprint}: written by the job that started it
    heartbeat     touched every second by the engine process (its liveness, also across hosts)
    ready.json    the engine's record (vLLM version, runner, connector, settings, start_id) once up
    queue/        requests: one JSON per client job (its batches, their part files, its host and pid)
    done/         one JSON per finished request ({ok, error, tokens, ...})
    cancel/       one empty file per request its client gave up on (the engine drops its sequences)
    failed.json   why the engine stopped itself ({start_id, stage, kind, error}): a stage its watchdog
                  found stuck, or one that raised after the model loaded (vllm_worker.fail_after_load)
    stats.json    busy seconds (time in engine steps), wall from ready to the last request done, idle
    stopped.json  the engine job's report once it ended (how it stopped, its stats); also kept in the
                  run's results (`record_dir`/START_ID.json: results/RUN/hidden_states/engine_stats/)
    engine.log    the engine's own log (or the spec's `log`: the rules put it under logs/)
    stop          asks the engine to exit once its queue is empty
    slots/        flock files: at most hidden_states.vllm.max_clients requests queued or running at once

Every client joins the engine of its scope (`join`: the live engine whose settings are the client's),
queues its batches (`enqueue`, at once: the engine takes them as soon as it is ready) and waits for its
parts (`wait_done`), failing loudly when the engine dies (its log's tail in the error, or the stage its
watchdog found stuck: engine_health.py; the rerun starts a new engine and resumes from the parts
saved). A client stopped by a signal cancels its request (`wait_or_cancel`), and the engine drops the
requests of a client whose process is gone, so a rerun never computes a batch twice. Every extraction
job the rules run has its scope's engine job beside it (planning.engines.planned_service); only tests
and benchmarks run a private engine (`start_or_join` in a folder of their own). The engine process
dies with the job that started it (its parent-death signal): no engine outlives Snakemake.

This module imports neither vLLM nor torch (the pipeline's side); the engine is
`python -m eagle3_pipeline.hidden_states.vllm_worker serve DIR` in vLLM's interpreter.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagle3_pipeline import io
from eagle3_pipeline.hidden_states import engine_health, kept
from eagle3_pipeline.hidden_states.vllm_backend import VllmBackendError
from eagle3_pipeline.locks import SlotLockError, held_slot
from eagle3_pipeline.server.process_identity import pid_alive

log = logging.getLogger(__name__)

WORKER_MODULE = "eagle3_pipeline.hidden_states.vllm_worker"
HEARTBEAT_STALE_S = 60.0  # a heartbeat older than this is a dead (or frozen) engine
POLL_S = 0.05  # a client's wait for its parts, and a stop's for the exit
JOIN_TIMEOUT_S = 600.0  # how long a client waits for its scope's engine job to start the engine
SERVICE_STOP_S = 30.0  # the engine job's stop: the engine's own exit, before its processes are killed
STOPPED_FILE = "stopped.json"
# what of the engine's ready record its stats record keeps (how it ran), beside how it stopped
RECORD_KEYS = ("engine_start_s", "vllm_version", "runner", "connector", "device", "dtype",
               "tensor_parallel_size", "enable_expert_parallel")  # fmt: skip
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


class EngineError(VllmBackendError):
    """The extraction engine could not start, died, or failed a request; the message says what to do."""


def fingerprint(spec: dict[str, Any]) -> str:
    """What an engine runs (not where it stages): a running engine with another one is replaced."""
    keep = {k: v for k, v in spec.items() if k not in ("start_id", "staging_dir", "idle_timeout_s", "log")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def engine_alive(directory: Path, info: dict[str, Any] | None = None) -> bool:
    """The engine named by process.json runs: its process (on this host) and a fresh heartbeat."""
    info = info or _read(directory / "process.json")
    if not info:
        return False
    if info.get("host") == socket.gethostname() and not pid_alive(int(info["pid"])):
        return False
    try:
        age = time.time() - (directory / "heartbeat").stat().st_mtime
    except OSError:
        age = time.time() - info.get("started_at", 0)  # not beating yet: starting
    return age < HEARTBEAT_STALE_S


def log_path(directory: Path, info: dict[str, Any] | None = None) -> Path:
    """The engine's log: where its start put it (process.json), else the folder's engine.log."""
    return Path((info or _read(directory / "process.json") or {}).get("log") or directory / "engine.log")


def log_tail(directory: Path, lines: int = 40, info: dict[str, Any] | None = None) -> str:
    try:
        return "\n".join(log_path(directory, info).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no engine log)"


def die_with_parent() -> None:
    """SIGTERM to this process when its parent dies, even by SIGKILL (Linux): in the engine process
    before it runs (the worker then kills its own session: its vLLM processes with it), and in the
    engine job under Snakemake (engine_job.main: the engine is stopped when snakemake is gone)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _start(
    directory: Path, python: str, spec: dict[str, Any], env: dict[str, str], worker: str
) -> dict[str, Any]:
    """Start an engine process (`python -m WORKER serve DIR`): a session of its own (stopped as one
    process group), and ended with the job that started it (a parent-death signal): it never outlives
    its job."""
    for name in ("ready.json", "heartbeat", "stop", "stats.json", STOPPED_FILE, engine_health.FAILED_FILE):
        (directory / name).unlink(missing_ok=True)
    for folder in ("queue", "done", engine_health.CANCEL_DIR):  # a dead engine's: its clients failed
        for stale in (directory / folder).glob("*"):
            stale.unlink(missing_ok=True)
        (directory / folder).mkdir(parents=True, exist_ok=True)
    start_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    spec = {**spec, "start_id": start_id}
    io.write_json(spec, directory / "spec.json", indent=None)
    log_file = Path(spec.get("log") or directory / "engine.log")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a") as sink:
        sink.write(f"\n=== engine {start_id} starting ===\n")
        sink.flush()
        process = subprocess.Popen(
            [python, "-m", worker, "serve", str(directory)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            start_new_session=True,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - one prctl call, no lock taken
        )
    info = {
        "start_id": start_id,
        "pid": process.pid,
        "host": socket.gethostname(),
        "fingerprint": fingerprint(spec),
        "started_at": time.time(),
        "python": python,
        "log": str(log_file),
    }
    io.write_json(info, directory / "process.json")
    log.info("extraction engine %s started (pid %d): its log is %s", start_id, process.pid, log_file)
    return info


def start_or_join(
    directory: Path, python: str, spec: dict[str, Any], env: dict[str, str], worker: str = WORKER_MODULE
) -> dict[str, Any]:
    """The process record of the engine that runs `spec` in `directory`: the live one, else a new one
    (a live engine with other settings is stopped first), the module `worker` run in `python` (a
    benchmark's former loop: benchmarks/drain_engine.py). Returns at once: the engine may be starting.
    """
    directory = Path(directory)
    with _locked(directory):
        info = _read(directory / "process.json")
        if info and engine_alive(directory, info) and info.get("fingerprint") != fingerprint(spec):
            log.info("the running engine %s runs other settings: stopping it", info["start_id"])
            _stop(directory, info, timeout_s=600)
            info = None
        if not (info and engine_alive(directory, info)):
            return _start(directory, python, spec, env, worker)
    log.info("using the running extraction engine %s (pid %s)", info["start_id"], info["pid"])
    return info


def _ready(directory: Path, info: dict[str, Any]) -> dict[str, Any] | None:
    ready = _read(directory / "ready.json")
    return ready if ready and ready.get("start_id") == info["start_id"] else None


def _died(directory: Path, info: dict[str, Any], what: str) -> EngineError:
    return EngineError(
        f"the extraction engine {info['start_id']} (pid {info.get('pid')}) {what}. Its log "
        f"({log_path(directory, info)}) ends with:\n{log_tail(directory, info=info)}"
    )


def _failed(directory: Path, info: dict[str, Any], failure: dict[str, Any]) -> EngineError:
    return EngineError(
        f"{engine_health.describe_failure(failure)}. Rerun: a new engine starts and the parts saved are "
        f"kept; its log: {log_path(directory, info)}"
    )


def _not_ready(info: dict[str, Any], timeout_s: float) -> EngineError:
    return EngineError(f"the extraction engine {info['start_id']} was not ready after {timeout_s:.0f} s")


def enqueue(directory: Path, request: dict[str, Any]) -> str:
    """Put one job's batches in the engine's queue (also before it is ready: it takes them first)."""
    name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    data = {**request, "name": name, "client": engine_health.client_record()}
    io.write_json(data, Path(directory) / "queue" / f"{name}.json", indent=None)
    return name


def wait_done(
    directory: Path, info: dict[str, Any], name: str, start_timeout_s: float = 3600
) -> dict[str, Any]:
    """Wait until the engine of `info` has written every part of request `name`.

    Raises:
        EngineError: the engine died (before it was ready, or while running the batches: the rerun
            resumes from the parts saved), was not ready after start_timeout_s, or failed the request.
    """
    directory = Path(directory)
    done_file = directory / "done" / f"{name}.json"
    ready_by = time.monotonic() + start_timeout_s
    while True:
        done = _read(done_file)
        if done is not None:
            done_file.unlink(missing_ok=True)
            if done.get("error"):
                failed = f"the extraction engine {info['start_id']} failed this job: {done['error']}"
                raise EngineError(failed)
            return done
        if failure := engine_health.read_failure(directory, info["start_id"]):
            raise _failed(directory, info, failure)
        current = _read(directory / "process.json") or {}
        if current.get("start_id") != info["start_id"] or not engine_alive(directory, current):
            if not _ready(directory, info):
                raise _died(directory, info, "exited before it was ready")
            raise _died(
                directory, info,
                "died while running this job's batches; rerun: a new engine starts and the parts "
                "saved are kept",
            )  # fmt: skip
        if time.monotonic() > ready_by and not _ready(directory, info):
            raise _not_ready(info, start_timeout_s)
        time.sleep(POLL_S)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def wait_or_cancel(directory: Path, info: dict[str, Any], name: str) -> dict[str, Any]:
    """`wait_done`, cancelling the request when this client is stopped meanwhile (SIGTERM, as Snakemake
    stops a job, or Ctrl-C): the engine then drops its sequences not yet run. A client killed outright
    (SIGKILL) is noticed by the engine through its pid."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main else None
    try:
        return wait_done(directory, info, name)
    except EngineError:
        raise  # the engine's failure: nothing of it to cancel
    except BaseException:
        engine_health.request_cancel(Path(directory), name)
        log.info("request %s cancelled: its client stopped", name)
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _stop(directory: Path, info: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Ask the engine to exit once its queue is empty, then signal its session if it does not."""
    (directory / "stop").touch()
    pid, local = int(info["pid"]), info.get("host") == socket.gethostname()
    deadline = time.monotonic() + timeout_s
    how = "exited"
    while engine_alive(directory, info) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if local and pid_alive(pid):
        how = "terminated"
        for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            end = time.monotonic() + wait
            while pid_alive(pid) and time.monotonic() < end:
                time.sleep(POLL_S)
            if not pid_alive(pid):
                break
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    stats = _read(directory / "stats.json") or {}
    (directory / "process.json").unlink(missing_ok=True)
    return {"start_id": info["start_id"], "pid": pid, "host": info.get("host"), "stopped": how, **stats}


def stop_engine(directory: Path, timeout_s: float = 600) -> dict[str, Any]:
    """Stop the engine of `directory` if one runs; returns what was done (for the stop rule's report)."""
    directory = Path(directory)
    if not (directory / "process.json").exists():
        return {"stopped": None, "reason": "no engine was started (every batch was already saved)"}
    with _locked(directory):
        info = _read(directory / "process.json")
        if not info:
            return {"stopped": None, "reason": "no engine was started"}
        if not engine_alive(directory, info):
            (directory / "process.json").unlink(missing_ok=True)
            failure = engine_health.read_failure(directory, info["start_id"])  # its watchdog's, if any
            return {
                "start_id": info["start_id"],
                "stopped": "already exited",
                **(_read(directory / "stats.json") or {}),
                **({"failed": failure} if failure else {}),
            }
        report = _stop(directory, info, timeout_s)
    log.info(
        "extraction engine %s %s: busy fraction %s", report["start_id"], report["stopped"],
        report.get("busy_fraction"),
    )  # fmt: skip
    return report


def stop_all(root: Path, timeout_s: float = 600) -> list[dict[str, Any]]:
    """Stop every engine under `root` (the workflow's onsuccess/onerror handler: none outlives a run)."""
    return [stop_engine(info.parent, timeout_s) for info in sorted(Path(root).rglob("process.json"))]


GONE_TIMEOUT_S = 2 * SERVICE_STOP_S + 30  # an engine job's stop kills its session well within this


def _session_alive(pgid: int) -> bool:
    """Any process left in the engine's session (vLLM's engine-core processes included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_gone(roots: list[Path], timeout_s: float = GONE_TIMEOUT_S) -> list[str]:
    """Wait until no extraction engine started on this host under `roots` has a process left.

    A GPU job calls it before it starts: Snakemake ends an engine job by a signal once its clients are
    done and starts the next job without waiting for the engine to exit, which takes seconds while
    vLLM frees the GPUs. Engines on other hosts (their own GPUs) are not waited for. Past `timeout_s`
    the job goes on with a warning (an engine that outlived its job's own kill is a pid reused).

    Returns:
        The engine folders that were waited for.
    """
    host, deadline, waited = socket.gethostname(), time.monotonic() + timeout_s, []
    records = [path for root in roots for name in ("process.json", STOPPED_FILE) for path in
               Path(root).rglob(name)]  # fmt: skip
    for record in records:
        info = _read(record) or {}
        if info.get("host") != host or not info.get("pid"):
            continue
        pgid = int(info["pid"])
        if _session_alive(pgid):
            waited.append(str(record.parent))
        while _session_alive(pgid) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if _session_alive(pgid):
            log.warning("engine %s (session %d) still has processes: going on", record.parent, pgid)
    if waited:
        log.info("waited for the extraction engines of %s to exit", ", ".join(sorted(set(waited))))
    return waited


def join(directory: Path, spec: dict[str, Any], timeout_s: float = JOIN_TIMEOUT_S) -> dict[str, Any]:
    """The process record of the engine its Snakemake job runs in `directory` (a client's side).

    The engine job starts with its clients (one group): this waits for it to start the engine, and
    checks that it runs the client's settings (both read them from the same rule params).

    Raises:
        EngineError: no live engine after `timeout_s`, or one with other settings.
    """
    directory = Path(directory)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = _read(directory / "process.json")
        if info and engine_alive(directory, info):
            if info.get("fingerprint") != fingerprint(spec):
                raise EngineError(
                    f"the extraction engine {info['start_id']} in {directory} runs other settings than "
                    "this job's: rerun (the engine job and its clients read the same config)"
                )
            log.info("joined the extraction engine %s (pid %s)", info["start_id"], info["pid"])
            return info
        if info and (failure := engine_health.read_failure(directory, info["start_id"])):
            raise _failed(directory, info, failure)  # it loaded, failed and is gone: no wait for it
        time.sleep(POLL_S)
    raise EngineError(
        f"no extraction engine started in {directory} within {timeout_s:.0f} s (rule serve_extraction_engine)"
    )


@contextlib.contextmanager
def client_slot(directory: Path, slots: int) -> Iterator[int]:
    """One of `slots` client places of the engine in `directory`, held while the block runs: Snakemake
    starts every client of an engine job at once (one group); each plans its shards first, then holds a
    slot while its request is queued and runs (vllm_extraction.run_on_engine), and packs after: at most
    `slots` requests are in the engine's queue, the next queued as soon as one is done (flock: released
    when the client exits, however it exits)."""
    folder = Path(directory) / "slots"
    try:
        with held_slot(folder, slots, POLL_S) as slot:
            yield slot
    except SlotLockError as err:
        raise EngineError(
            f"{folder}: cannot lock a client slot ({err}): the results filesystem must support flock"
        ) from err


class _Terminated(Exception):
    """The engine job was asked to end (SIGTERM: Snakemake's end of a service job, or Ctrl-C)."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated(signal.Signals(signum).name)


def serve(
    directory: Path,
    python: str,
    spec: dict[str, Any],
    env: dict[str, str],
    marker: Path | None = None,
    handle_signals: bool = True,
    record_dir: Path | None = None,
) -> dict[str, Any]:
    """Rule serve_extraction_engine: run the engine of `directory` until Snakemake ends the job (SIGTERM,
    once every client is done) or the engine exits by itself; then stop it and write its report
    (stopped.json: how it stopped, its stats). A leftover engine of the folder is stopped first. Ended
    by Snakemake, it drops the finished shards' kept links once every client it served is done
    (kept.release).

    Args:
        marker: the job's service() output: this process (`job_pid`, `host`: its clients end when it is
            gone, engine_watch.py), then also the engine's start id and pid once it runs.
        handle_signals: SIGTERM and SIGINT end the serving (main thread only: tests serve from a thread
            and end it with `stop_engine`).
        record_dir: where the run keeps every engine start's stats (`write_record`): the report's
            table of engine starts (validate/report_engine.py).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    previous = {}
    if handle_signals:
        previous = {sig: signal.signal(sig, _raise_terminated) for sig in (signal.SIGTERM, signal.SIGINT)}
    info: dict[str, Any] | None = None
    how = "exited by itself"
    job = {"job_pid": os.getpid(), "host": socket.gethostname()}  # its clients watch it (engine_watch)
    try:
        if marker is not None:
            io.write_json(job, Path(marker))
        with _locked(directory):
            old = _read(directory / "process.json")
            if old and engine_alive(directory, old):
                _stop(directory, old, timeout_s=SERVICE_STOP_S)
            info = _start(directory, python, spec, env, WORKER_MODULE)
        if marker is not None:
            io.write_json({**info, **job}, Path(marker))
        while pid_alive(int(info["pid"])):  # reaps it once it exits
            if not (directory / "process.json").exists():  # stopped by hand (stop_engine)
                break
            time.sleep(POLL_S)
        if (directory / "stop").exists() or not (directory / "process.json").exists():
            how = "stopped"  # by hand (stop_engine), not on its own (idle, watchdog, crash)
    except _Terminated as why:
        how = f"ended by Snakemake ({why})"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    report = {"engine_dir": str(directory), "how": how}
    if info is not None:
        report.update(_stop(directory, info, timeout_s=SERVICE_STOP_S))
        report["failed"] = engine_health.read_failure(directory, info["start_id"])
        # Snakemake's end of a service job: every client done; the finished shards' links go (kept.py)
        if how == "ended by Snakemake (SIGTERM)":
            report["kept_released"] = kept.release(directory, info["start_id"])
    io.write_json(report, directory / STOPPED_FILE)
    if record_dir is not None and info is not None:
        write_record(report, _read(directory / "ready.json") or {}, Path(record_dir))
    if marker is not None:
        Path(marker).unlink(missing_ok=True)
    log.info(
        "extraction engine %s %s (%s): busy fraction %s", report.get("start_id"), report.get("stopped"), how,
        report.get("busy_fraction"),
    )  # fmt: skip
    return report


def write_record(report: dict[str, Any], ready: dict[str, Any], record_dir: Path) -> Path:
    """The run's record of one engine start, `record_dir/START_ID.json`: how it ran (its ready record:
    start seconds, vLLM, runner, device, TP), how it stopped, and its stats (busy fraction over its
    ready time, where the rest went, each request's queued/taken/done times). Kept in the results, one
    file per start, so a run's engine starts and their busy time are read from its files (the report
    shows them). Not a Snakemake output: the engine job's only output is its service file."""
    same = ready.get("start_id") == report.get("start_id")  # not a former engine's ready record
    record = {**{key: ready[key] for key in RECORD_KEYS if same and key in ready}, **report}
    path = Path(record_dir) / f"{report['start_id']}.json"
    io.write_json(record, path)
    return path


def main(argv: list[str]) -> int:
    """`python -m eagle3_pipeline.hidden_states.engine stop DIR`: stop an engine by hand."""
    if len(argv) != 2 or argv[0] != "stop":
        print("usage: python -m eagle3_pipeline.hidden_states.engine stop ENGINE_DIR")  # noqa: T201
        return 2
    print(json.dumps(stop_engine(Path(argv[1]))))  # noqa: T201
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
