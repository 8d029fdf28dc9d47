"""validate/speedup.py on a stand-in server whose speed is known: the arms alternate, the order flips
every repeat, and the figures are the median and range of what was timed."""

from __future__ import annotations

import time

from eagle3_pipeline.validate.speedup import alternate, concurrency_levels, headline, level_questions


def test_levels_are_one_the_checks_and_twice_capped_by_the_questions():
    assert concurrency_levels(4, 12) == [1, 4, 8]
    assert concurrency_levels(8, 12) == [1, 8, 12]
    assert concurrency_levels(1, 12) == [1, 2]


def test_a_level_sends_two_rounds_at_least_eight_at_most_every_question():
    questions = [{"id": str(i)} for i in range(27)]
    assert [len(level_questions(questions, c)) for c in (1, 4, 13, 27)] == [8, 8, 26, 27]
    assert level_questions(questions, 1) == questions[:8]  # the first ones, in the check's order
    assert level_questions(questions[:5], 1) == questions[:5]


def test_the_arms_alternate_with_the_order_flipped_and_report_median_and_range():
    calls: list[tuple[str, int]] = []
    asked: list[int] = []

    def ask(url: str, questions: list[dict], concurrency: int) -> list[dict]:
        calls.append((url, concurrency))
        asked.append(len(questions))
        time.sleep(0.01 if url == "with" else 0.02)  # the draft halves the wall time
        timing = {"time_to_first_token_ms": 5.0, "mean_itl_ms": 1.0 if url == "with" else 2.0}
        return [{"status": "ok", "completion_tokens": 10, "timing": timing} for _ in questions]

    questions = [{"id": str(i)} for i in range(10)]
    figures = alternate(ask, "with", "without", questions, [1, 2], repeats=3)
    assert calls == [
        ("with", 1), ("without", 1), ("without", 1), ("with", 1), ("with", 1), ("without", 1),
        ("with", 2), ("without", 2), ("without", 2), ("with", 2), ("with", 2), ("without", 2),
    ]  # fmt: skip
    assert asked == [8] * 12  # every run of both levels: at least 8 of the 10 questions
    assert figures["by_concurrency"]["1"]["questions"] == figures["by_concurrency"]["2"]["questions"] == 8
    level = figures["by_concurrency"]["1"]
    assert 1.3 < level["speedup"]["median"] < 2.5 and level["speedup"]["min"] <= level["speedup"]["max"]
    assert level["with_draft"]["itl_ms"] == 1.0 and level["without_draft"]["itl_ms"] == 2.0
    assert len(level["runs"]) == 3
    top = headline(figures, 2, "cpu")
    assert top["speedup"] == figures["by_concurrency"]["2"]["speedup"]["median"] and top["device"] == "cpu"


def test_the_recorded_figures_say_how_many_questions_each_level_sent():
    from eagle3_pipeline.validate.headline import speedup_figures

    spread = {"median": 1.41234, "min": 1.3, "max": 1.5}
    serve_check = {"speedup": {"by_concurrency": {"1": {"speedup": spread, "questions": 8}, "27": {}}}}
    assert speedup_figures(serve_check) == {"1": {"median": 1.4123, "min": 1.3, "max": 1.5, "questions": 8}}
