"""docs/demo.md's "What the demo shows" quotes the demo's own figures (issue 40, item 3).

results/ is not committed, so the last fresh demo's figures are recorded in docs/demo-figures.json by
`python -m eagle3_pipeline.validate.headline results/demo docs/demo-figures.json --measured ...` (from its
validation JSON). README's table is written from them (tests/unit/test_headline_table.py); every figure the
section's prose quotes must be within the stated run-to-run spread of the recorded one (a stale page fails
here); the epoch is 1-based in both, and the spread the page states is the one recorded.
"""

from __future__ import annotations

import json
import re

import pytest
from support.workflow import REPO

from eagle3_pipeline.validate.headline import SPREAD

FIGURES = json.loads((REPO / "docs" / "demo-figures.json").read_text())
SECTION = (
    (REPO / "docs" / "demo.md").read_text().split("\n## What the demo shows\n", 1)[1].split("\n## ", 1)[0]
)
HEADLINE = " ".join(SECTION.split())  # one line: a figure's words may wrap anywhere
NUMBER = r"(\d+\.\d+)"
INTERVAL = rf"{NUMBER}\s+\[{NUMBER},\s+{NUMBER}\]"


def quoted(pattern: str) -> list[float]:
    """The numbers the page's headline gives where `pattern` matches (once)."""
    found = re.findall(pattern, HEADLINE)
    assert len(found) == 1, f"docs/demo.md's headline should say this once: {pattern!r} ({len(found)} times)"
    groups = found[0] if isinstance(found[0], tuple) else (found[0],)
    return [float(x) for x in groups]


def recorded(figure: dict) -> list[float]:
    return [figure["value"], *figure["ci95"]]


SERVED, OFFLINE, BASELINE = FIGURES["served"], FIGURES["offline"], FIGURES["baseline"]["served"]
CASES = {
    "served sampled": (rf"is accepted at \*\*{INTERVAL}\*\*", SERVED["sampled"]),
    "sampled replay": (rf"where vLLM drafts \({INTERVAL}\)", OFFLINE["replayed"]["sampled"]),
    "served greedy": (rf"Greedy, the same draft is served at \*\*{INTERVAL}\*\*", SERVED["greedy"]),
    "greedy replay": (rf"its greedy replay \({INTERVAL}\)", OFFLINE["replayed"]["greedy"]),
    "offline": (rf"Offline over every anchor: {INTERVAL}", OFFLINE["every_anchor"]),
    "baseline sampled": (rf"\(the baseline\): sampled {INTERVAL}", BASELINE["sampled"]),
    "baseline greedy": (rf"baseline\): sampled [^,]+, [^,]+, greedy\s+{INTERVAL}", BASELINE["greedy"]),
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_a_headline_figure_is_the_recorded_runs_within_the_spread(name):
    pattern, figure = CASES[name]
    quoted_here, record = quoted(pattern), recorded(figure)
    assert all(abs(a - b) <= SPREAD for a, b in zip(quoted_here, record, strict=True)), (
        f"docs/demo.md's {name} {quoted_here} is further than the run-to-run spread {SPREAD} from the "
        f"recorded {record} (docs/demo-figures.json): update its section What the demo shows"
    )


def test_served_by_k_and_the_learning_curve():
    by_k = FIGURES["served"]["by_k"]
    for k, runs in by_k.items():
        greedy, sampled = quoted(rf"{NUMBER} / {NUMBER} at\s+k = {k}\b")
        assert (
            abs(greedy - runs["greedy"]["value"]) <= SPREAD
            and abs(sampled - runs["sampled"]["value"]) <= SPREAD
        )
    curve = re.findall(INTERVAL, HEADLINE.split("The learning curve", 1)[1].split("offline for", 1)[0])
    assert len(curve) == len(FIGURES["learning_curve"]) > 0
    for point, figure in zip(curve, FIGURES["learning_curve"], strict=True):
        assert all(
            abs(float(a) - b) <= SPREAD for a, b in zip(point, recorded(figure["offline"]), strict=True)
        )


def test_the_epoch_is_one_based_in_both_and_the_spread_is_stated():
    selection = FIGURES["selection"]
    assert FIGURES["epoch_numbering"].startswith("1-based")
    epoch, epochs = quoted(r"shipped epoch (\d+)\s+of (\d+) \(counted from 1")
    assert (epoch, epochs) == (selection["chosen_epoch"], selection["epochs"])
    assert FIGURES["spread"]["acceptance_length"] == SPREAD
    assert f"differ by up to {SPREAD} in acceptance length, the run-to-run spread" in HEADLINE
    questions, k = quoted(r"(\d+) validation questions, (\d+) speculative tokens")
    assert (questions, k) == (FIGURES["served"]["questions"], FIGURES["served"]["k"])
