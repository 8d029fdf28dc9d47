"""README.md's headline figures are the demo's own (issue 40, item 3).

results/ is not committed, so the last fresh demo's figures are recorded in docs/demo-figures.json by
`python -m eagle3_pipeline.validate.headline results/demo docs/demo-figures.json` (from its validation
JSON). Every figure README.md quotes in "What the demo shows" must be within the stated run-to-run spread
of the recorded one (a stale headline fails here); the epoch is 1-based in both, and the spread README
states is the one recorded.
"""

from __future__ import annotations

import json
import re

import pytest
from support.workflow import REPO

from eagle3_pipeline.validate.headline import SPREAD

FIGURES = json.loads((REPO / "docs" / "demo-figures.json").read_text())
HEADLINE = (REPO / "README.md").read_text().split("**What the demo\nshows**", 1)[1].split("\n## ", 1)[0]
NUMBER = r"(\d+\.\d+)"
INTERVAL = rf"{NUMBER}\s+\[{NUMBER},\s+{NUMBER}\]"


def quoted(pattern: str) -> list[float]:
    """The numbers README's headline gives where `pattern` matches (once)."""
    found = re.findall(pattern, HEADLINE)
    assert len(found) == 1, f"README's headline should say this once: {pattern!r} ({len(found)} times)"
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
    readme, record = quoted(pattern), recorded(figure)
    assert all(abs(a - b) <= SPREAD for a, b in zip(readme, record, strict=True)), (
        f"README's {name} {readme} is further than the run-to-run spread {SPREAD} from the recorded "
        f"{record} (docs/demo-figures.json): update README.md's headline"
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
    assert f"differ by up to {SPREAD} in acceptance length, the run-to-run spread" in " ".join(
        HEADLINE.split()
    )
    questions, k = quoted(r"(\d+) validation questions, (\d+) speculative tokens")
    assert (questions, k) == (FIGURES["served"]["questions"], FIGURES["served"]["k"])
