"""README's headline table is what `make readme-table` writes from docs/demo-figures.json, never a hand
edit, and it sits on README's first screen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_pipeline.validate.headline_table import BEGIN, END, headline_table, with_table

REPO = Path(__file__).resolve().parents[2]
FIGURES = json.loads((REPO / "docs" / "demo-figures.json").read_text())


def test_the_readme_table_is_the_one_written_from_the_recorded_figures():
    readme = (REPO / "README.md").read_text()
    assert with_table(readme, headline_table(FIGURES)) == readme, (
        "README's headline table differs from docs/demo-figures.json's: run `make readme-table`"
    )


def test_the_table_is_on_the_readme_first_screen():
    first_screen = (REPO / "README.md").read_text().split("\n## ", 2)
    assert len(first_screen) == 3 and BEGIN in first_screen[1] and END in first_screen[1]
    assert len("\n## ".join(first_screen[:2]).splitlines()) < 45


def figure(value: float, low: float, high: float) -> dict:
    return {"value": value, "ci95": [low, high]}


def test_each_draft_is_served_with_its_interval_and_the_run_is_stated():
    figures = {
        "measured": "2026-01-02 at abc1234 on 2 idle CPU cores",
        "spread": {"acceptance_length": 0.3},
        "served": {
            "sampled": figure(2.1612, 2.0042, 2.3485),
            "greedy": figure(2.2056, 2.0312, 2.389),
            "questions": 27,
            "k": 3,
        },
        "baseline": {"served": {"sampled": figure(1.49, 1.42, 1.5662), "greedy": figure(1.5, 1.4, 1.6)}},
    }
    table = headline_table(figures)
    rows = [line for line in table.splitlines() if line.startswith("| the ")]
    assert rows == [
        "| the target's own traces (this pipeline) | **2.16** [2.00, 2.35] | 2.21 [2.03, 2.39] |",
        "| the dataset's answers (the baseline) | **1.49** [1.42, 1.57] | 1.50 [1.40, 1.60] |",
    ]
    caption = " ".join(table.split("\n\n", 1)[0].split())
    assert "27 validation questions, 3 speculative tokens" in caption
    assert "differ by up to 0.3" in caption and "2026-01-02 at abc1234 on 2 idle CPU cores" in caption


def test_only_the_text_between_the_markers_is_replaced():
    readme = f"# title\n\nbefore\n{BEGIN}\nold table\n{END}\nafter\n"
    assert with_table(readme, "new table") == f"# title\n\nbefore\n{BEGIN}\nnew table\n\n{END}\nafter\n"


@pytest.mark.parametrize(
    "readme", ["no markers\n", f"{END}\n{BEGIN}\n", f"{BEGIN}\n{END}\n{BEGIN}\n{END}\n"], ids=str
)
def test_a_readme_without_its_markers_once_in_order_is_refused(readme):
    with pytest.raises(ValueError, match="markers once each"):
        with_table(readme, "table")
