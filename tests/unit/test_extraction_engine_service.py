"""The extraction engine as a Snakemake job (issue 37): which extraction jobs consume it (a stale shard:
an output missing or older than its traces), and the client slots that keep at most max_clients of the
jobs Snakemake starts together at work."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from eagle3_pipeline.hidden_states import engine


def _touch(path, mtime):
    path.write_text("x")
    os.utime(path, (mtime, mtime))
    return str(path)


def test_a_shard_consumes_its_engine_only_when_an_output_is_missing_or_older_than_its_traces(tmp_path):
    traces = [_touch(tmp_path / "train.parquet", 100), _touch(tmp_path / "validation.parquet", 100)]
    states, meta = tmp_path / "shard.safetensors", tmp_path / "shard.json"
    outputs = [str(states), str(meta)]
    assert engine.needs_engine(traces, outputs)  # nothing extracted yet
    _touch(states, 200)
    assert engine.needs_engine(traces, outputs)  # one output missing
    _touch(meta, 200)
    assert not engine.needs_engine(traces, outputs)  # done: no engine job for it
    _touch(tmp_path / "validation.parquet", 300)
    assert engine.needs_engine(traces, outputs)  # new traces of one split
    assert not engine.needs_engine([str(tmp_path / "not-there.parquet")], [str(meta)])  # traces deleted


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
