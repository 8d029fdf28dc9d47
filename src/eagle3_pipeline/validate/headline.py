"""A run's headline figures from its own validation JSON: served acceptance (sampled: what the serve check
enforces; greedy: a diagnostic) with their intervals, the offline replay the sampled run is checked against,
the baseline, the epoch shipped and why, the learning curve and the served speedup.

One source of these numbers for the report's front page (validate/report_front.py) and for the demo's
recorded figures (`python -m eagle3_pipeline.validate.headline results/demo docs/demo-figures.json
--measured "..."`: README's table is written from them by validate/headline_table.py, docs/demo.md's
prose is checked against them by tests/unit/test_demo_figures.py). Epochs are 1-based here, as people
count them (selection.json's `chosen.epoch` is 0-based).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EPOCH_NUMBERING = "1-based (selection.json's chosen.epoch is 0-based: epoch 1 here is its 0)"
# Run-to-run spread of the demo's acceptance lengths: the recorded fresh runs of one setup served the
# main draft at 2.22-2.51 greedy (docs/demo.md, "Measured runs"): the traces are sampled and the target's
# fit is a CPU-time budget, so every run trains on other tokens. A README figure further than this from
# the recorded run is stale.
SPREAD = 0.3
SPREAD_SOURCE = "served greedy 2.22-2.51 over the recorded fresh runs of one setup (docs/demo.md)"


def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _figure(value: float | None, ci95: list[float] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    return {"value": round(float(value), 4), "ci95": [round(float(x), 4) for x in ci95] if ci95 else None}


def served_figures(serve_check: dict[str, Any] | None) -> dict[str, Any]:
    """The served run at the generation's sampling (enforced) and greedy (diagnostic), by k."""
    if not serve_check:
        return {}
    sampled = serve_check.get("sampled") or {}
    comparison = serve_check.get("sampled_comparison") or {}
    greedy_check = serve_check.get("offline_comparison") or {}
    return {
        "sampled": _figure(sampled.get("acceptance_length"), sampled.get("ci95")),
        "greedy": _figure(serve_check.get("acceptance_length"), serve_check.get("ci95")),
        "questions": serve_check.get("questions"),
        "k": serve_check.get("num_speculative_tokens"),
        "sampled_check": {
            "agree": comparison.get("agree"),
            "enforced": comparison.get("enforced"),
            "reference": comparison.get("reference"),
        },
        "greedy_check": {"agree": greedy_check.get("agree"), "enforced": greedy_check.get("enforced")},
        # what each run sent (serve_check.json's own record; a result from before it: None)
        "sampling": {"sampled": sampled.get("sampling"), "greedy": serve_check.get("sampling")},
        "by_k": {
            k: {mode: _figure(run.get("acceptance_length"), run.get("ci95")) for mode, run in runs.items()}
            for k, runs in (serve_check.get("by_k") or {}).items()
        },
    }


def offline_figures(offline: dict[str, Any] | None, k: int) -> dict[str, Any]:
    """Offline at k over every anchor, and the served run replayed along the traces (per reference)."""
    if not offline or len(offline.get("acceptance_length") or []) < k:
        return {}
    replayed = offline.get("replayed") or {}
    return {
        "every_anchor": _figure(offline["acceptance_length"][k - 1], _at(offline.get("ci95"), k)),
        "replayed": {
            mode: _figure(run["acceptance_length"][k - 1], _at(run.get("ci95"), k))
            for mode, run in replayed.items()
            if len(run.get("acceptance_length") or []) >= k
        },
    }


def _at(intervals: list[list[float]] | None, k: int) -> list[float] | None:
    """The interval at k draft tokens (results from before intervals have none)."""
    return intervals[k - 1] if intervals and len(intervals) >= k else None


def selection_figures(selection_json: dict[str, Any] | None) -> dict[str, Any]:
    """The epoch shipped, 1-based, its gain over the last epoch and the selection's optimism."""
    if not selection_json:
        return {}
    chosen, optimism = selection_json["chosen"], selection_json.get("optimism") or {}
    return {
        "chosen_epoch": chosen["epoch"] + 1,
        "epochs": len(selection_json.get("candidates") or []) * selection_json.get("select_every_epochs", 1),
        "gain_over_last": round(
            chosen["acceptance_length"]
            - chosen.get("last_epoch_acceptance_length", chosen["acceptance_length"]),
            4,
        ),
        "reason": chosen.get("reason"),
        "optimism": _figure(optimism.get("optimism"), optimism.get("ci95")),
    }


def curve_figures(curve: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The learning curve's points: shards, training tokens, optimizer steps, offline acceptance."""
    return [
        {
            "shards": point["shards"],
            "training_tokens": point.get("training_tokens"),
            "optimizer_steps": point.get("optimizer_steps"),
            "offline": _figure(point.get("mean_accepted_length"), point.get("ci95")),
        }
        for point in (curve or {}).get("points", [])
    ]


def speedup_figures(serve_check: dict[str, Any] | None) -> dict[str, Any]:
    """The alternating speedup's median and range per concurrency (a CPU figure on the CPU build), and
    how many questions each of its runs sent (validate/speedup.py level_questions)."""
    speedup = (serve_check or {}).get("speedup") or {}
    return {
        str(c): {key: round(v, 4) for key, v in entry["speedup"].items()}
        | {"questions": entry.get("questions")}
        for c, entry in (speedup.get("by_concurrency") or {}).items()
        if entry.get("speedup")
    }


# where each validation JSON lies under results/{run}/ (plot_validation's input names)
PATHS = {
    "serve_check": "validation/serve_check.json",
    "offline": "validation/offline.json",
    "baseline_serve_check": "baseline/validation/serve_check.json",
    "baseline_offline": "baseline/validation/offline.json",
    "selection": "validation/selection.json",
    "learning_curve": "validation/learning_curve.json",
}


def headline(results: str | Path) -> dict[str, Any]:
    """Every headline figure of the run under `results` (results/{run}), from its validation JSON."""
    return headline_from({name: Path(results) / path for name, path in PATHS.items()})


def headline_from(paths: dict[str, str | Path | None]) -> dict[str, Any]:
    """The headline figures from the named validation files (PATHS' names; a missing one is left out)."""
    read = {name: _read(Path(path)) if path else None for name, path in paths.items()}
    serve_check = read.get("serve_check")
    served = served_figures(serve_check)
    k = served.get("k") or 3
    return {
        "epoch_numbering": EPOCH_NUMBERING,
        "spread": {"acceptance_length": SPREAD, "source": SPREAD_SOURCE},
        "served": served,
        "offline": offline_figures(read.get("offline"), k),
        "baseline": {
            "served": served_figures(read.get("baseline_serve_check")),
            "offline": offline_figures(read.get("baseline_offline"), k),
        },
        "selection": selection_figures(read.get("selection")),
        "learning_curve": curve_figures(read.get("learning_curve")),
        "speedup": speedup_figures(serve_check),
    }


def main(argv: list[str]) -> int:
    """Record a run's headline figures, with what they were measured on (the README table states it)."""
    parser = argparse.ArgumentParser(
        prog="python -m eagle3_pipeline.validate.headline", description=main.__doc__
    )
    parser.add_argument("results", type=Path, help="the run's folder, e.g. results/demo")
    parser.add_argument("output", type=Path, help="the figures' file, e.g. docs/demo-figures.json")
    parser.add_argument(
        "--measured",
        required=True,
        help="when, at which commit, on which machine and load (e.g. '2026-12-05, fresh clone at 0006bc5, "
        "2 idle CPU cores')",
    )
    args = parser.parse_args(argv)
    if not (args.results / "validation" / "serve_check.json").exists():
        sys.stderr.write(
            f"ERROR: {args.results}/validation/serve_check.json does not exist (fix: run the demo first)\n"
        )
        return 1
    figures = {
        "results": str(args.results),
        "measured": args.measured,
        **headline(args.results),
    }
    args.output.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
