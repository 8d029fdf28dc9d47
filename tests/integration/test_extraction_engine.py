"""One extraction engine for many jobs (issue 22), with a real vLLM CPU engine: the jobs of one engine
folder join the engine its job serves (vllm_extraction.serve_engine, as rule serve_extraction_engine
runs it; issue 37), a dead client's request is dropped unrun, an engine killed mid-run fails its
client loudly and ends its job, and the rerun (a new engine job) resumes from the parts saved
(finished batches are not recomputed).

Two engine starts in all (the shared one, then the one after the kill), kept small for 2 CI cores as in
test_hidden_states_vllm.py: max_model_len 512, VLLM_CPU_KVCACHE_SPACE=1, enforce_eager.
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

import pytest
from support.hidden_states import trace_rows, write_traces
from support.requirements import require
from support.vllm_server import cpu_vllm_env

from eagle3_pipeline import io
from eagle3_pipeline.hidden_states import HiddenStateShard, engine, extract, vllm_extraction
from eagle3_pipeline.hidden_states.job import ShardJob
from eagle3_pipeline.settings import HiddenStatesSettings, section

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
pytestmark = [pytest.mark.vllm, pytest.mark.slow]
# one request in flight at a time: slow enough that the kill below lands mid-run (the same settings for
# every job: an engine started with other settings would be replaced, not shared)
ENGINE = {
    "python": str(VLLM_PYTHON),
    "dtype": "bfloat16",
    "max_model_len": 512,
    "enforce_eager": True,
    "max_in_flight_tokens": 1,
}


@pytest.fixture()
def cpu_env(monkeypatch):
    for name, value in cpu_vllm_env().items():
        monkeypatch.setenv(name, value)


def _settings(batch_tokens: int = 200) -> HiddenStatesSettings:
    return section(
        HiddenStatesSettings,
        {"batch_tokens": batch_tokens, "backend": "vllm", "vllm": ENGINE, "max_seq_len": 400},
    )


def _job(root: Path, traces: Path, target: Path, name: str, engine_dir: Path) -> ShardJob:
    (root / name).mkdir(parents=True, exist_ok=True)
    return ShardJob(
        traces=traces, shard=0, target=target, work=root / "work" / name,
        output=root / name / "shard-00000.safetensors", metadata=root / name / "shard-00000.json",
        engine_dir=engine_dir,
    )  # fmt: skip


def _engine_job(target: Path, engine_dir: Path) -> tuple[threading.Thread, list[dict]]:
    """The engine job of `engine_dir` (serve_engine), in a thread: its report lands in the list."""
    reports: list[dict] = []

    def serve() -> None:
        reports.append(
            vllm_extraction.serve_engine(_settings(), target, None, engine_dir, handle_signals=False)
        )

    thread = threading.Thread(target=serve)
    thread.start()
    return thread, reports


def test_jobs_share_one_engine_and_a_killed_engine_fails_its_client_and_the_rerun_resumes(
    hs_target, hs_tokenizer, tmp_path, cpu_env
):
    require("vllm")  # also under the module's marker: fails, not skips, under CI=true
    engine_dir = tmp_path / "engine"
    rows = trace_rows(hs_tokenizer, 24, shard=0)
    first = _job(tmp_path, write_traces(tmp_path / "a.parquet", rows[:4]), hs_target, "a", engine_dir)
    second = _job(tmp_path, write_traces(tmp_path / "b.parquet", rows[4:8]), hs_target, "b", engine_dir)
    job, reports = _engine_job(hs_target, engine_dir)
    try:
        # two jobs, one engine: both join the engine their job runs, neither starts one
        meta_a = extract.extract_shards(_settings(), [first])[0]
        meta_b = extract.extract_shards(_settings(), [second])[0]
        start_id = meta_a["engine"]["start_id"]
        assert meta_b["engine"]["start_id"] == start_id
        assert (
            meta_a["engine"]["runner"] == "v1"
            and meta_a["engine"]["connector"] == "SyncHiddenStatesConnector"
        )
        assert meta_a["engine"]["max_model_len"] == 512 and meta_a["engine"]["max_num_batched_tokens"] == 512

        # a client killed before the engine took its request: its pid is gone, the engine runs none of it
        dead = subprocess.Popen(["true"])
        dead.wait()
        orphan_part = tmp_path / "orphan.safetensors"
        batch = {"part": str(orphan_part), "index": [0], "input_ids": [list(range(1, 65))]}
        orphan = {
            "name": "orphan",
            "batches": [batch],
            "client": {"host": socket.gethostname(), "pid": dead.pid},
        }
        io.write_json(orphan, engine_dir / "queue" / "orphan.json")
        deadline = time.monotonic() + 60
        while (json.loads((engine_dir / "stats.json").read_text()).get("cancelled") or 0) < 1:
            assert time.monotonic() < deadline, "the engine never dropped the dead client's request"
            time.sleep(0.1)
        assert not orphan_part.exists() and not (engine_dir / "done" / "orphan.json").exists()

        # a job of one sample per batch, fed one request at a time so that the kill lands mid-run
        killed = _job(tmp_path, write_traces(tmp_path / "c.parquet", rows[8:]), hs_target, "c", engine_dir)
        failure: list[BaseException] = []

        def client() -> None:
            try:
                extract.extract_shards(_settings(batch_tokens=1), [killed])
            except BaseException as err:  # noqa: BLE001 - the failure is what this test checks
                failure.append(err)

        thread = threading.Thread(target=client)
        thread.start()
        parts = killed.work / "parts"
        deadline = time.monotonic() + 300
        while not list(parts.glob("batch-*.safetensors")) and time.monotonic() < deadline:
            time.sleep(0.01)
        info = json.loads((engine_dir / "process.json").read_text())
        assert info["start_id"] == start_id  # still the first jobs' engine
        os.killpg(info["pid"], signal.SIGKILL)
        thread.join(timeout=120)
        assert failure and isinstance(failure[0], engine.EngineError), failure
        assert "died while running this job's batches" in str(failure[0]) and start_id in str(failure[0])
        job.join(timeout=120)  # the engine job ends with its engine, and says so
        assert reports[0]["start_id"] == start_id and reports[0]["how"] == "exited by itself", reports
        saved = sorted(p.name for p in parts.glob("batch-*.safetensors"))
        assert 0 < len(saved) < 16, saved  # killed mid-run: some batches saved, not all

        # the rerun: a new engine job, the saved batches kept as they were, only the others run
        job, reports = _engine_job(hs_target, engine_dir)
        meta_c = extract.extract_shards(_settings(batch_tokens=1), [killed])[0]
        assert meta_c["engine"]["start_id"] != start_id
        assert meta_c["engine"]["last_run"]["batches"] == 16 - len(saved)
        assert meta_c["num_samples"] == 16
        with HiddenStateShard(killed.output) as shard:
            assert len(shard) == 16
    finally:
        report = engine.stop_engine(engine_dir)
        job.join(timeout=120)
    assert report["stopped"] in ("exited", "terminated")
    assert reports and reports[-1]["how"] == "stopped", reports
    assert not engine.engine_alive(engine_dir)
