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
