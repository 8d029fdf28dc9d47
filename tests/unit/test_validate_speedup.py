"""validate/speedup.py on a stand-in server whose speed is known: the arms alternate, the order flips
every repeat, and the figures are the median and range of what was timed."""

from __future__ import annotations

import time

from eagle3_pipeline.validate.speedup import alternate, concurrency_levels, headline


def test_levels_are_one_the_checks_and_twice_capped_by_the_questions():
    assert concurrency_levels(4, 12) == [1, 4, 8]
    assert concurrency_levels(8, 12) == [1, 8, 12]
    assert concurrency_levels(1, 12) == [1, 2]


def test_the_arms_alternate_with_the_order_flipped_and_report_median_and_range():
    calls: list[tuple[str, int]] = []

    def ask(url: str, questions: list[dict], concurrency: int) -> list[dict]:
        calls.append((url, concurrency))
        time.sleep(0.01 if url == "with" else 0.02)  # the draft halves the wall time
        timing = {"time_to_first_token_ms": 5.0, "mean_itl_ms": 1.0 if url == "with" else 2.0}
        return [{"status": "ok", "completion_tokens": 10, "timing": timing} for _ in questions]

    figures = alternate(ask, "with", "without", [{"id": "a"}, {"id": "b"}], [1, 2], repeats=3)
    assert calls == [
        ("with", 1), ("without", 1), ("without", 1), ("with", 1), ("with", 1), ("without", 1),
        ("with", 2), ("without", 2), ("without", 2), ("with", 2), ("with", 2), ("without", 2),
    ]  # fmt: skip
    level = figures["by_concurrency"]["1"]
    assert 1.3 < level["speedup"]["median"] < 2.5 and level["speedup"]["min"] <= level["speedup"]["max"]
    assert level["with_draft"]["itl_ms"] == 1.0 and level["without_draft"]["itl_ms"] == 2.0
    assert len(level["runs"]) == 3
    top = headline(figures, 2, "cpu")
    assert top["speedup"] == figures["by_concurrency"]["2"]["speedup"]["median"] and top["device"] == "cpu"
