"""The report's page of extraction engine starts (validate/report_engine.py): one row per start the
run's engine jobs recorded, the busy fraction over the ready time, the longest wait for a request."""

from __future__ import annotations

import json

from eagle3_pipeline.validate import report_engine


def _record(folder, start_id, busy, ready, timeline=None):
    record = {
        "start_id": start_id, "how": "ended by Snakemake (SIGTERM)", "engine_start_s": 40.0,
        "busy_s": busy, "ready_to_done_s": ready, "busy_fraction": round(busy / ready, 4),
        "requests": 2, "tokens": 54000, "timeline": timeline or [],
        "idle_s": {"before_first_request": 0.1, "loop": 0.2, "tail": 0.1, "engine_empty": ready - busy - 0.4},
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{start_id}.json").write_text(json.dumps(record))


def test_longest_wait_is_the_widest_gap_with_nothing_in_the_engine():
    timeline = [
        {"taken_s": -1.0, "done_s": 3.0},  # queued and taken before ready: no wait
        {"taken_s": 0.5, "done_s": 5.0},  # taken while the first ran: no wait
        {"taken_s": 7.5, "done_s": 9.0},  # 2.5 s with nothing to run
        {"taken_s": 9.2, "done_s": 10.0},
    ]
    assert report_engine.longest_wait(timeline) == 2.5
    assert report_engine.longest_wait([]) is None


def test_the_page_lists_every_engine_start_of_every_scope_with_its_busy_fraction(tmp_path):
    run = tmp_path / "results" / "r"
    main, baseline = (
        run / "hidden_states" / "engine_stats",
        run / "baseline" / "hidden_states" / "engine_stats",
    )
    _record(main / "epoch-0-window-1", "20261205T120500-bb", 9.0, 10.0)
    _record(main / "epoch-0-window-0", "20261205T120000-aa", 4.0, 10.0, [{"taken_s": 6.0, "done_s": 9.0}])
    _record(baseline, "20261205T130000-cc", 1.0, 2.0)
    records = report_engine.read_records([main, baseline], run)
    assert [r["start_id"] for r in records] == [
        "20261205T120000-aa",
        "20261205T120500-bb",
        "20261205T130000-cc",
    ]
    assert [r["scope"] for r in records] == [
        "hidden_states/engine_stats/epoch-0-window-0",
        "hidden_states/engine_stats/epoch-0-window-1",
        "baseline/hidden_states/engine_stats",
    ]
    out = tmp_path / "engine.html"
    report_engine.engine_page([main, baseline], out, run)
    page = out.read_text()
    assert "3 extraction engine start(s) recorded; busy 14.0 s of 22.0 s" in page and "fraction 0.64" in page
    assert page.count("<tr>") == 4 and "20261205T120500-bb" in page and "0.900" in page
    assert "<td>6.000</td>" in page  # the first window's engine waited 6 s for its first request


def test_a_run_without_engine_records_says_so(tmp_path):
    out = tmp_path / "engine.html"
    report_engine.engine_page([tmp_path / "none"], out)
    assert "No extraction engine start is recorded" in out.read_text() and "<table>" not in out.read_text()
