"""Served against offline acceptance, acceptance by source and the speedup, on real recorded vLLM
/metrics readings (tests/data/validate, vLLM 0.32.0 CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3_pipeline.server.draft_command import ServeCheckError
from eagle3_pipeline.server.vllm_args import serving_argv
from eagle3_pipeline.settings import ServerSettings, ValidateSettings
from eagle3_pipeline.validate.acceptance import online_acceptance
from eagle3_pipeline.validate.matched import compare_matched
from eagle3_pipeline.validate.metrics import parse_prometheus, spec_decode_counters
from eagle3_pipeline.validate.served_figures import (
    disagreement_message,
    measure_by_source,
    source_groups,
    speedup,
    time_by_source,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "validate"


def counters(name: str):
    return spec_decode_counters(parse_prometheus((DATA / name).read_text()))


def served(name: str) -> dict:
    """serve_check.json's figures for the recorded reading (all counters from zero)."""
    after = counters(name)
    zero = counters("vllm-0.32.0-metrics-before.txt")
    return online_acceptance(zero, after).to_dict()


def offline_with(rates: list[float], anchors: int = 2000) -> dict:
    return {"anchors": anchors, "prefix_counts": [round(r * anchors) for r in rates]}


def replay_with(rates: list[float], drafts: int = 2000) -> list[dict]:
    """One replayed question whose drafts were accepted at these rates per position (matched.py)."""
    return [{"drafts": drafts, "accepted_per_position": [round(r * drafts) for r in rates]}]


def test_a_draft_fed_other_layers_is_refused():
    # recorded: an untrained (or mis-fed) draft, 117 drafts, nothing accepted, against a trained offline
    figures = served("vllm-0.32.0-metrics-untrained-draft.txt")
    comparison = compare_matched(figures, replay_with([0.85, 0.72, 0.62]), tolerance=0.15)
    assert not comparison["agree"]
    message = disagreement_message(comparison)
    assert "position 0: served 0.000 vs offline 0.850" in message and "auxiliary layer ids" in message


def test_nothing_to_compare_is_not_agreement():
    comparison = compare_matched({"drafts": 0, "per_position_rate": [None]}, replay_with([0.5]), 0.15)
    assert not comparison["agree"] and "nothing" in disagreement_message(comparison)


QUESTIONS = [
    {"id": f"q{i}", "question": "?", "source": s} for i, s in enumerate(["math", "code", "math", None])
]


def test_questions_are_grouped_by_source():
    groups = source_groups(QUESTIONS)
    assert list(groups) == ["code", "math", "unknown"]
    assert [q["id"] for q in groups["math"]] == ["q0", "q2"]


def test_acceptance_by_source_from_consecutive_real_readings():
    """Two groups measured one after the other: the recorded 'before' reading, then the trained draft's
    reading as the first group's end, then that reading again as the second group's end (no drafts)."""
    before = counters("vllm-0.32.0-metrics-before.txt")
    after = counters("vllm-0.32.0-metrics-trained-draft.txt")
    readings = {"code": (before, after), "math": (after, after)}

    def measure(group: list[dict]) -> dict:
        start, end = readings[group[0]["source"]]
        figures = online_acceptance(start, end).to_dict()
        as_dict = lambda c: c.__dict__ | {"accepted_per_position": list(c.accepted_per_position)}  # noqa: E731
        return figures | {
            "questions": len(group),
            "answered": len(group),
            "failed": {},
            "completion_tokens": 40 * len(group),
            "seconds": 2.0,
            "tokens_per_s": 20.0 * len(group),
            "counters_before": as_dict(start),
            "counters_after": as_dict(end),
        }

    result = measure_by_source(measure, [q for q in QUESTIONS if q["source"]])
    assert result["acceptance_length"] == pytest.approx(1 + 86 / 35)  # the whole run: first to last reading
    assert result["by_source"]["code"]["acceptance_length"] == pytest.approx(1 + 86 / 35)
    assert result["by_source"]["math"]["drafts"] == 0
    assert result["tokens_per_s"] == pytest.approx(120 / 4.0)


def test_speedup_is_tokens_per_second_with_over_without_the_draft():
    with_draft = {
        "tokens_per_s": 30.0,
        "by_source": {"code": {"tokens_per_s": 40.0}, "math": {"tokens_per_s": 20.0}},
    }
    without = time_by_source(lambda group: [{"status": "ok", "completion_tokens": 0}] * len(group), QUESTIONS)
    assert set(without["by_source"]) == {"code", "math", "unknown"} and without["completion_tokens"] == 0
    without = {
        "tokens_per_s": 20.0,
        "by_source": {"code": {"tokens_per_s": 20.0}, "math": {"tokens_per_s": 20.0}},
    }
    figures = speedup(with_draft, without)
    assert figures["speedup"] == 1.5 and figures["by_source"] == {"code": 2.0, "math": 1.0}


def test_the_target_alone_runs_without_any_speculative_config():
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--port=8000"]
    argv += ["--speculative_config", '{"method":"ngram"}', "--host", "0.0.0.0"]
    words = serving_argv(argv, None, "127.0.0.1", 19301)
    assert "--speculative_config" not in words and '{"method":"ngram"}' not in words
    assert words[-4:] == ["--host", "127.0.0.1", "--port", "19301"] and "--port=8000" not in words


@pytest.mark.parametrize(("tolerance", "raises"), [(0.02, True), (None, False)])
def test_the_check_fails_on_a_matched_disagreement_unless_the_tolerance_is_null(tmp_path, tolerance, raises):
    """The run at the generation's own sampling against its sampled replay decides (what production
    serves); the greedy run is compared and reported, a diagnostic."""
    import json

    from eagle3_pipeline.validate.serve_check import check_against_offline

    ids = {"question_ids": ["a", "b"], "failed": {}}
    greedy = served("vllm-0.32.0-metrics-trained-draft.txt") | ids | {"sampling": {"temperature": 0.0}}
    sampled = served("vllm-0.32.0-metrics-untrained-draft.txt") | ids | {"sampling": {"temperature": 0.6}}
    result = greedy | {"sampled": sampled}
    trained = {"drafts": 50, "accepted_per_position": [40, 30, 20]}
    like_greedy = {"drafts": 35, "accepted_per_position": [32, 28, 26]}  # the greedy run's own rates
    replay = {q: {"greedy": like_greedy, "sampled": trained} for q in ("a", "b", "c")}
    offline = offline_with([0.85, 0.72, 0.62]) | {
        "served_replay": {"num_speculative_tokens": 3, "samples": replay}
    }
    (tmp_path / "offline.json").write_text(json.dumps(offline))
    validate = ValidateSettings(served_offline_tolerance=tolerance)
    if raises:
        with pytest.raises(ServeCheckError, match="position 0: served 0.000 vs offline 0.800"):
            check_against_offline(result, tmp_path / "offline.json", validate, tmp_path / "work")
        kept = json.loads((tmp_path / "work" / "serve_check.rejected.json").read_text())
        assert kept["sampled_comparison"]["agree"] is False and kept["sampled_comparison"]["questions"] == 2
    else:
        check_against_offline(result, tmp_path / "offline.json", validate, tmp_path / "work")
        assert result["sampled_comparison"]["agree"] is False and not result["sampled_comparison"]["enforced"]
    assert result["sampled_comparison"]["reference"] == "sampled"
    greedy_check = result["offline_comparison"]
    assert greedy_check["reference"] == "greedy" and greedy_check["agree"] and not greedy_check["enforced"]


def test_without_a_sampled_run_the_first_run_decides(tmp_path):
    import json

    from eagle3_pipeline.validate.serve_check import check_against_offline

    ids = {"question_ids": ["a", "b"], "failed": {}}
    result = served("vllm-0.32.0-metrics-untrained-draft.txt") | ids | {"sampling": {"temperature": 0.0}}
    trained = {"drafts": 50, "accepted_per_position": [40, 30, 20]}
    offline = offline_with([0.85, 0.72, 0.62]) | {
        "served_replay": {"num_speculative_tokens": 3, "samples": {q: {"greedy": trained} for q in "ab"}}
    }
    (tmp_path / "offline.json").write_text(json.dumps(offline))
    with pytest.raises(ServeCheckError, match="position 0: served 0.000 vs offline 0.800"):
        check_against_offline(result, tmp_path / "offline.json", ValidateSettings(), tmp_path / "work")
    assert result["offline_comparison"]["enforced"] and "sampled_comparison" not in result


def test_a_source_that_fails_is_reported_and_the_others_measured():
    after = counters("vllm-0.32.0-metrics-trained-draft.txt")
    reading = after.__dict__ | {"accepted_per_position": list(after.accepted_per_position)}

    def measure(group: list[dict]) -> dict:
        if group[0]["source"] == "code":
            raise ServeCheckError("no validation question was answered")
        figures = online_acceptance(after, after).to_dict()
        return figures | {"questions": len(group), "answered": len(group), "failed": {}} | {
            "completion_tokens": 10, "seconds": 1.0, "tokens_per_s": 10.0,
            "counters_before": reading, "counters_after": reading,
        }  # fmt: skip

    result = measure_by_source(measure, QUESTIONS)
    assert result["by_source"]["code"] == {
        "questions": 1,
        "answered": 0,
        "error": "no validation question was answered",
    }
    assert result["answered"] == 3 and result["questions"] == 4
    with pytest.raises(ServeCheckError, match="no validation question"):
        measure_by_source(measure, [q for q in QUESTIONS if q["source"] == "code"])
    assert speedup(result, result)["by_source"] == {"math": 1.0, "unknown": 1.0}


def _run(tmp_path: Path, questions: list[dict]):
    from eagle3_pipeline.generate.payload import Sampling
    from eagle3_pipeline.validate.draft_serving import ServeCheckRun

    sampling = Sampling(model="demo", max_tokens=8, temperature=0.0)
    return ServeCheckRun(checkpoint_dir=tmp_path, questions=questions, sampling=sampling, state_dir=tmp_path,
                         concurrency=4, request_timeout_s=30)  # fmt: skip


def test_a_systemd_unit_is_timed_without_the_draft_on_restored_production(scripted_endpoint, tmp_path):
    """After the drop-in is restored, production serves the target alone: the same questions are timed
    against it (the endpoint answers as vLLM does, 8 completion tokens each)."""
    from eagle3_pipeline.validate.draft_serving import ProductionDraftServing

    questions = [
        {"id": f"q{i}", "question": f"q {i}", "source": "math" if i % 2 else "code"} for i in range(6)
    ]
    server = ServerSettings(unit="vllm.service", base_url=scripted_endpoint.base_url)
    with_draft = {"tokens_per_s": 1e9, "by_source": {"math": {"tokens_per_s": 1e9}}}
    production = ProductionDraftServing(server, ValidateSettings(), {})
    figures = production.time_without_draft(_run(tmp_path, questions), with_draft)
    assert all(scripted_endpoint.requests[q["question"]] == 1 for q in questions)
    assert figures["completion_tokens_without_draft"] == 6 * 8 and figures["speedup"] > 1
    assert set(figures["by_source"]) == {"math"} and figures["without_draft"].startswith("the production")


def test_no_speedup_when_production_was_not_running_before_the_check(scripted_endpoint, tmp_path):
    from eagle3_pipeline.validate.draft_serving import ProductionDraftServing

    scripted_endpoint.healthy = False
    server = ServerSettings(unit="vllm.service", base_url=scripted_endpoint.base_url)
    production = ProductionDraftServing(server, ValidateSettings(speedup=True), {})
    figures = production.time_without_draft(_run(tmp_path, []), {})
    assert figures["speedup"] is None and "not serving after the restore" in figures["reason"]
    assert not scripted_endpoint.requests


def test_the_layers_vllm_logs_must_be_the_trained_ones(tmp_path):
    import json

    from eagle3_pipeline.validate.spec_decode import served_layers

    (tmp_path / "config.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [2, 4, 5]}))
    v1 = "INFO gpu_model_runner.py:5244] Using auxiliary layers from speculative config: (2, 4, 5)\n"
    assert served_layers(v1, tmp_path)["served"] == [2, 4, 5]
    v2 = "INFO eagle3_utils.py:30] Using Eagle3 auxiliary layers from model: (2, 4, 6)\n"
    with pytest.raises(
        ServeCheckError, match=r"auxiliary layers \[2, 4, 6\] \(from the model\).*\[2, 4, 5\]"
    ):
        served_layers(v2, tmp_path)
    off_by_one = v1.replace("(2, 4, 5)", "(1, 3, 4)")
    with pytest.raises(ServeCheckError, match="hidden_states.layers"):
        served_layers(off_by_one, tmp_path)
    assert served_layers("no such line\n", tmp_path)["served"] is None
