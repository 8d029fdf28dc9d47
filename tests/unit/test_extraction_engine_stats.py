"""The extraction engine's busy fraction (engine_loop.Server.stats): time in engine steps over the wall
from the engine ready to the last request done, and where the rest of that wall went. Pure arithmetic
on the marks the serving loop sets; the loop itself runs in tests/integration/test_extraction_engine.py.
"""

from __future__ import annotations

import pytest

from eagle3_pipeline.hidden_states.engine_loop import Server


def _server(tmp_path) -> Server:
    spec = {"max_in_flight_tokens": 4096, "idle_timeout_s": 900}
    return Server(tmp_path, spec)


def test_busy_fraction_is_step_time_over_ready_to_last_done_and_the_idle_parts_add_up(tmp_path):
    server = _server(tmp_path)
    server.ready_at, server.first_request, server.last_step, server.last_done = 100.0, 100.5, 109.0, 110.0
    server.busy_s, server.loop_s = 8.0, 0.25
    stats = server.stats()
    assert stats["ready_to_done_s"] == 10.0 and stats["busy_fraction"] == 0.8
    assert stats["working_s"] == 9.5 and stats["busy_fraction_working"] == pytest.approx(8 / 9.5, abs=1e-4)
    idle = stats["idle_s"]
    assert idle == {"before_first_request": 0.5, "loop": 0.25, "tail": 1.0, "engine_empty": 0.25}
    assert stats["busy_s"] + sum(idle.values()) == pytest.approx(stats["ready_to_done_s"])


def test_an_engine_that_got_no_request_reports_no_fraction(tmp_path):
    server = _server(tmp_path)
    server.ready_at = 100.0
    stats = server.stats()
    assert stats["busy_fraction"] is None and stats["busy_fraction_working"] is None
    assert stats["requests"] == 0 and stats["tokens"] == 0


def test_every_answered_request_is_on_the_timeline_from_the_engine_ready(tmp_path):
    """stats()["timeline"]: each request's queued (its queue file's time), taken and done seconds from
    the engine ready: a client that queued before the engine was ready shows a negative queued_s."""
    import json
    import os
    import time

    server = _server(tmp_path)
    (tmp_path / "queue").mkdir()
    (tmp_path / "done").mkdir()
    now = time.time()
    request = tmp_path / "queue" / "c1.json"
    request.write_text(json.dumps({"name": "c1", "batches": []}))
    os.utime(request, (now - 5, now - 5))
    server.ready_wall = now - 2
    server._take_requests({})  # a request with no batch is done at once
    (entry,) = server.stats()["timeline"]
    assert entry["name"] == "c1" and entry["tokens"] == 0
    assert entry["queued_s"] == pytest.approx(-3, abs=0.01)
    assert 2 <= entry["taken_s"] <= entry["done_s"] < 60
    assert json.loads((tmp_path / "done" / "c1.json").read_text())["ok"]
