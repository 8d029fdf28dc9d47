"""The extraction engine as a Snakemake job (issue 37): the client slots that keep at most max_clients of
the jobs Snakemake starts together at work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from eagle3_pipeline.hidden_states import engine


def test_client_slots_let_max_clients_work_at_once_and_free_a_slot_when_its_client_exits(tmp_path):
    with engine.client_slot(tmp_path, 2) as first, engine.client_slot(tmp_path, 2) as second:
        assert {first, second} == {0, 1}
        # a third client (another process) waits while both slots are held
        code = (
            "import sys, time; from eagle3_pipeline.hidden_states import engine\n"
            f"with engine.client_slot({str(tmp_path)!r}, 2) as slot: print(slot, time.time())"
        )
        third = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
        assert third.poll() is None  # still waiting for a slot
        released = time.time()
    out, _ = third.communicate(timeout=30)
    slot, took = out.split()
    assert slot in ("0", "1") and float(took) >= released


def test_a_client_plans_before_it_takes_a_slot_and_packs_after_it_left_it(
    hs_target, hs_tokenizer, tmp_path, monkeypatch
):
    """Issue 37, item 5: Snakemake starts every client with the engine; each plans its shard at once
    (while the engine starts and other clients' batches run), holds a slot only while its request is
    queued and runs, and packs after: the next client's request is queued while this one's drains."""
    import contextlib

    from support.hidden_states import trace_rows, write_traces

    from eagle3_pipeline.hidden_states import job, vllm_extraction
    from eagle3_pipeline.settings import HiddenStatesSettings, section

    traces = []
    for split, n in (("train", 2), ("validation", 1)):
        traces.append(str(write_traces(tmp_path / f"{split}.parquet", trace_rows(hs_tokenizer, n))))
    outputs = [str(tmp_path / "out" / s / "shard-00000.safetensors") for s in ("train", "validation")]
    jobs = job.rule_jobs(
        traces, outputs, [o.replace(".safetensors", ".json") for o in outputs], 0,
        str(hs_target / "config.json"), str(tmp_path / "work"), engine_dir=str(tmp_path / "engine"),
    )  # fmt: skip
    settings = section(HiddenStatesSettings, {"backend": "vllm", "max_seq_len": 400, "batch_tokens": 256})
    events: list[str] = []

    @contextlib.contextmanager
    def slot(directory, slots):
        events.append("slot")
        yield 0
        events.append("free")

    plan_shard = vllm_extraction.plan_shard
    monkeypatch.setattr(vllm_extraction, "plan_shard", lambda *a: events.append("plan") or plan_shard(*a))
    monkeypatch.setattr(engine, "client_slot", slot)
    monkeypatch.setattr(engine, "join", lambda directory, spec: {"start_id": "s", "pid": 1})
    monkeypatch.setattr(vllm_extraction, "_submit", lambda *a: events.append("run") or {"tokens": 0})
    monkeypatch.setattr(vllm_extraction, "finish_shard", lambda *a: events.append("pack") or {})
    monkeypatch.setattr(vllm_extraction, "commit_shard", lambda *a: events.append("commit"))
    monkeypatch.setattr(vllm_extraction.kept, "keep", lambda *a: events.append("keep"))
    vllm_extraction.extract_shards(settings, jobs)
    assert events[:7] == ["plan", "plan", "slot", "run", "free", "pack", "pack"]
    assert events[7:] == ["commit", "keep", "commit", "keep"]  # kept only once committed


def test_the_runs_record_of_an_engine_start_keeps_its_stats_and_how_it_ran(tmp_path):
    report = {"start_id": "20261205T120000-ab", "how": "ended by Snakemake (SIGTERM)", "busy_fraction": 0.93}
    ready = {"start_id": "20261205T120000-ab", "engine_start_s": 41.5, "runner": "v1", "layer_ids": [2]}
    path = engine.write_record(report, ready, tmp_path / "engine_stats")
    record = json.loads(path.read_text())
    assert path.name == "20261205T120000-ab.json"
    assert record == {"engine_start_s": 41.5, "runner": "v1", **report}  # not every ready key
    # a former engine's ready record (another start id) says nothing about this one
    other = json.loads(engine.write_record(report, {**ready, "start_id": "old"}, tmp_path).read_text())
    assert "engine_start_s" not in other and other["busy_fraction"] == 0.93


def _engine_session(seconds: float) -> subprocess.Popen:
    """A stand-in for an exiting engine: a session of its own whose leader has a child (as vLLM's
    engine-core process is), the leader exiting first and the child `seconds` later."""
    child = f"import time; time.sleep({seconds})"
    code = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {child!r}])"
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def test_a_gpu_job_waits_until_a_stopped_engine_s_whole_session_is_gone(tmp_path):
    session = _engine_session(1.5)
    session.wait()  # the leader is gone, its child still runs in the session
    record = tmp_path / "engine" / "epoch-0-window-1" / engine.STOPPED_FILE
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"pid": session.pid, "host": engine.socket.gethostname()}))
    # another host's engine (its own GPUs) and a folder without a record are not waited for
    other = tmp_path / "engine" / "other" / "process.json"
    other.parent.mkdir()
    other.write_text(json.dumps({"pid": os.getpid(), "host": "another-node"}))
    start = time.monotonic()
    assert engine.wait_gone([tmp_path / "engine", tmp_path / "baseline"]) == [str(record.parent)]
    assert time.monotonic() - start >= 1.0  # it waited for the child
    assert engine.wait_gone([tmp_path / "engine"]) == []  # gone: nothing to wait for


def test_an_engine_session_that_outlives_the_timeout_is_left_with_a_warning(tmp_path, caplog):
    session = _engine_session(30)
    session.wait()
    (tmp_path / "process.json").write_text(
        json.dumps({"pid": session.pid, "host": engine.socket.gethostname()})
    )
    try:
        assert engine.wait_gone([tmp_path], timeout_s=0.3) == [str(tmp_path)]
        assert "still has processes" in caplog.text
    finally:
        os.killpg(session.pid, 9)


def test_client_slots_on_a_filesystem_without_flock_fail_naming_it(tmp_path, monkeypatch):
    import errno
    import fcntl

    import pytest

    def refuse(handle: object, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)  # once waited forever, taking it for a held slot
    with (
        pytest.raises(engine.EngineError, match="must support flock") as raised,
        engine.client_slot(tmp_path, 2),
    ):
        pass
    assert str(tmp_path / "slots") in str(raised.value)
