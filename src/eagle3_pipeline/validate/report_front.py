"""The report's first page: the verdict before the pictures.

`snakemake --report` opens on the workflow description (the `report:` directive in rules/validate.smk),
which is this run's `results/{run}/report/front.rst` once plot_validation has written it: the served
check's verdict and what decided it (the sampled comparison is enforced, greedy is a diagnostic), the
sampling each run sent, the headline figures with their 95% question-level intervals, the baseline
comparison, the epoch shipped and why, and one line per figure. Every number comes from
validate/headline.py, as README's do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eagle3_pipeline import io
from eagle3_pipeline.validate.headline import PATHS, headline_from

# the report's figures in reading order: file name, item label, what it shows (one line each)
FIGURES = (
    ("acceptance.png", "Acceptance", "served against replayed per position (the check), by k, by source"),
    ("comparison.png", "Own traces vs baseline", "trained on the target's own traces against the baseline"),
    ("slices.png", "Where the draft is accepted", "offline by context length and thinking vs answer"),
    ("selection.png", "Epoch selection", "offline acceptance per kept epoch, the one shipped starred"),
    ("learning_curve.png", "Learning curve", "acceptance against training tokens at equal optimizer steps"),
    ("training.png", "Training", "loss, teacher-forced acceptance and per-step accuracy by epoch"),
    ("trace_lengths.png", "Trace lengths", "prompt, completion, thinking against answer"),
    ("trace_stats.html", "Trace statistics", "prompts kept and dropped, split sizes"),
    ("server.html", "Server snapshot", "the unit and vLLM flags the traces came from"),
    ("engine.html", "Extraction engine", "each engine start, its busy fraction over its ready time"),
)  # fmt: skip


# Snakemake's report centres its content pane vertically ("items-center" in a scrolling flex box): a page
# taller than the window loses its top, here the verdict, out of reach. Aligned to the top instead; the
# style lives as long as this page is shown.
TOP_ALIGNED = """.. raw:: html

   <style>div.items-center.justify-center.h-screen.overflow-auto{align-items:flex-start}</style>"""


def _fig(figure: dict[str, Any] | None) -> str:
    if not figure:
        return "not measured"
    interval = figure.get("ci95")
    return f"**{figure['value']:.2f}**" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")


def verdict_lines(figures: dict[str, Any]) -> list[str]:
    """The served check's verdict, what decided it, and the greedy diagnostic."""
    served, replayed = figures["served"], (figures["offline"].get("replayed") or {})
    if not served:
        return ["**Served check: not run** (validate.serve_check: false): offline figures only."]
    check = served["sampled_check"]
    passed = check.get("agree") and check.get("enforced")
    state = "PASSED" if passed else ("FAILED" if check.get("enforced") else "reported, not enforced")
    greedy = served["greedy_check"]
    size = f"{served['questions']} questions, " if served.get("questions") else ""
    return [
        f"**Served check: {state}.** Decided by the sampled comparison: the draft served by vLLM at the "
        f"generation's sampling, {_fig(served['sampled'])} tokens per target step ({size}k = "
        f"{served['k']}), against the same run replayed offline along the traces, "
        f"{_fig(replayed.get('sampled'))}, position by position under a paired question bootstrap.",
        f"Greedy (a diagnostic, not enforced): served {_fig(served['greedy'])} against its replay "
        f"{_fig(replayed.get('greedy'))}: the pair {'agrees' if greedy.get('agree') else 'DISAGREES'}.",
        *sampling_lines(served.get("sampling") or {}),
    ]


def sampling_lines(sampling: dict[str, Any]) -> list[str]:
    """What each served run sent: the generation's sampling whole, the check setting max_tokens (and the
    greedy run's temperature); nothing for a result that did not record it."""
    if not sampling.get("sampled"):
        return []
    lines = [f"Sampling sent, the generation's: {_sent(sampling['sampled'])}."]
    if sampling.get("greedy") and sampling["greedy"] != sampling["sampled"]:
        lines.append(f"Greedy run: {_sent(sampling['greedy'])}.")
    return lines


def _sent(sampling: dict[str, Any]) -> str:
    """`key value` for each value sent (null and empty ones are not; the model is the server's), as an
    inline literal (reStructuredText would read `name_` as a link)."""
    return (
        "``"
        + ", ".join(
            f"{key} {json.dumps(value) if isinstance(value, dict) else value}"
            for key, value in sampling.items()
            if key != "model" and value is not None and value != {}
        )
        + "``"
    )


def baseline_lines(figures: dict[str, Any]) -> list[str]:
    baseline = figures["baseline"]["served"]
    if not baseline:
        return ["Baseline: not trained (validate.baseline: false)."]
    own, other = (figures["served"] or {}).get("sampled"), baseline.get("sampled")
    gain = own["value"] - other["value"] if own and other else None
    said = f": the target's own traces gain {gain:+.2f} sampled" if gain is not None else ""
    return [
        "Baseline (the same draft trained on the dataset's own answers): "
        f"sampled {_fig(baseline['sampled'])}, greedy {_fig(baseline['greedy'])}{said}."
    ]


def selection_lines(figures: dict[str, Any]) -> list[str]:
    selection = figures["selection"]
    lines = [f"Offline over every anchor: {_fig(figures['offline'].get('every_anchor'))}."]
    if selection:
        lines.append(
            f"Epoch shipped: **{selection['chosen_epoch']} of {selection['epochs']}** (counted from 1), "
            f"{selection['gain_over_last']:+.3f} over the last epoch; selection optimism "
            f"{_fig(selection['optimism'])}. Why: {selection['reason'] or 'not recorded'}."
        )
    curve = figures["learning_curve"]
    if curve:
        points = " / ".join(_fig(p["offline"]) for p in curve)
        shards = " / ".join(str(p["shards"]) for p in curve)
        lines.append(
            f"Learning curve at equal optimizer steps: {points} offline for {shards} training shards."
        )
    for concurrency, speedup in figures["speedup"].items():
        asked = f", {speedup['questions']} questions per run" if speedup.get("questions") else ""
        lines.append(
            f"Served speedup at concurrency {concurrency}: {speedup['median']:.2f}x "
            f"[{speedup['min']:.2f}, {speedup['max']:.2f}] (median and range of alternating repeats{asked})."
        )
    return lines


def front_page(paths: dict[str, str | Path | None], run: str, present: set[str]) -> str:
    """The first page as reStructuredText (`present`: the figure files this report holds)."""
    figures = headline_from(paths)
    items = [f"* `{name}`_ ({label}): {what}" for name, label, what in FIGURES if name in present]
    sections = [
        f"Verdict: run {run}\n{'=' * (len(run) + 13)}",
        TOP_ALIGNED,
        *verdict_lines(figures),
        *baseline_lines(figures),
        *selection_lines(figures),
        "Figures (click one; its caption says what is drawn and how):",
        "\n".join(items),
    ]
    return "\n\n".join(sections) + "\n"


def write_front_page(inputs: dict[str, str | None], outputs: dict[str, str]) -> None:
    """Rule plot_validation: results/{run}/report/front.rst from the run's validation JSON."""
    run = Path(outputs["front"]).parent.parent.name
    present = {Path(path).name for name, path in outputs.items() if name != "front"}
    paths = {name: inputs.get(name) for name in PATHS}  # the validation JSON only
    io.write_text(front_page(paths, run, present), outputs["front"])
