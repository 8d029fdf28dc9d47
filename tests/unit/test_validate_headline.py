"""Recording a run's headline figures (`python -m eagle3_pipeline.validate.headline`): the figures come
with what they were measured on, which README's table states."""

from __future__ import annotations

import json

import pytest

from eagle3_pipeline.validate import headline


def test_recording_a_run_needs_what_it_was_measured_on(tmp_path, capsys):
    results = tmp_path / "results" / "demo"
    (results / "validation").mkdir(parents=True)
    (results / "validation" / "serve_check.json").write_text(
        json.dumps({"acceptance_length": 2.2, "ci95": [2.0, 2.4], "questions": 27})
    )
    output = tmp_path / "figures.json"
    with pytest.raises(SystemExit):
        headline.main([str(results), str(output)])
    assert "--measured" in capsys.readouterr().err and not output.exists()
    assert headline.main([str(results), str(output), "--measured", "today, 2 idle cores"]) == 0
    recorded = json.loads(output.read_text())
    assert recorded["measured"] == "today, 2 idle cores"
    assert recorded["served"]["greedy"] == {"value": 2.2, "ci95": [2.0, 2.4]}
