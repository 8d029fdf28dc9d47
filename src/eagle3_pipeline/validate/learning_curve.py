"""The learning curve: what more data buys.

validate.learning_curve lists fractions of the training shards; the draft is trained again on the
first k = ceil(fraction x shards) shards of the stable shard order (the {variant}
learning_curve/shards-{k:05d}/ of the draft's rules, on the main draft's hidden states), so the subsets
are nested and a point depends only on its own shards: adding shards later reruns only the points whose
k changes. k = all the shards is the main draft itself (not trained twice). Each point's offline
acceptance is measured on the same validation states, and a straight line is fitted to acceptance
length against log2(training tokens): its slope is what doubling the data is expected to buy, as far
as the points reach.

Importable without torch (the rules read `curve_points` at parse time).
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eagle3_pipeline import io

log = logging.getLogger(__name__)

PREFIX = "learning_curve/shards-"


def curve_points(fractions: Sequence[float], shards: int) -> dict[int, list[float]]:
    """Training shards per point -> the fractions that asked for it: k = ceil(fraction x shards), at
    least 1 (fractions that round to the same k are one point). Empty without fractions.

    Raises:
        ValueError: a fraction outside (0, 1].
    """
    points: dict[int, list[float]] = {}
    for fraction in fractions:
        if not 0 < fraction <= 1:
            raise ValueError(f"validate.learning_curve: {fraction} is not a fraction in (0, 1]")
        k = min(shards, max(1, math.ceil(fraction * shards - 1e-9)))
        points.setdefault(k, []).append(fraction)
    return dict(sorted(points.items()))


def variant_name(k: int, shards: int) -> str:
    """The {variant} of the point trained on k shards: "" (the main draft) for all of them."""
    return "" if k == shards else f"{PREFIX}{k:05d}/"


def fit_trend(tokens: Sequence[float], lengths: Sequence[float]) -> dict[str, Any] | None:
    """Least squares of acceptance length on log2(training tokens): slope = length gained per doubling;
    r2 (None when the lengths do not vary). None with fewer than two distinct token counts."""
    xs = [math.log2(t) for t in tokens]
    if len(set(xs)) < 2:
        return None
    slope, intercept = statistics.linear_regression(xs, list(lengths))
    r2 = statistics.correlation(xs, list(lengths)) ** 2 if len(set(lengths)) > 1 else None
    return {
        "x": "log2(training tokens)",
        "y": "acceptance length",
        "per_doubling": slope,
        "intercept": intercept,
        "r2": r2,
        "points": len(xs),
    }


def point(
    k: int,
    shards: int,
    fractions: Sequence[float],
    history: Sequence[Mapping[str, Any]],
    offline: Mapping[str, Any],
    selected: Mapping[str, Any] | None,
    steps: int,
) -> dict[str, Any]:
    """One point: its subset, training tokens (loss tokens of one epoch) and offline acceptance.
    `selected`: the point's selection.json (data, not the config), None without checkpoint selection."""
    tokens = (history[0].get("train") or {}).get("tokens") if history else None
    chosen = (selected or {}).get("chosen") or {}
    return {
        "fractions": list(fractions),
        "shards": k,
        "fraction_of_shards": k / shards,
        "training_tokens": tokens,
        "epoch": chosen.get("epoch", len(history) - 1),
        "conditional": offline["conditional"],
        "acceptance_length": offline["acceptance_length"],
        "mean_accepted_length": offline["acceptance_length"][steps - 1],
        "ci95": (offline.get("ci95") or [None] * steps)[steps - 1],  # at k, question-level
    }


def curve_record(points: list[dict[str, Any]], k: int) -> dict[str, Any]:
    """learning_curve.json: the points and the trend of their acceptance length at k draft tokens."""
    usable = [p for p in points if p["training_tokens"]]
    trend = fit_trend([p["training_tokens"] for p in usable], [p["mean_accepted_length"] for p in usable])
    return {
        "metric": f"offline acceptance length at k = {k} draft tokens (validate.num_speculative_tokens)",
        "k": k,
        "points": points,
        "trend": trend,
    }


def chosen_acceptance(selected: Mapping[str, Any]) -> dict[str, Any]:
    """The offline figures of the epoch selection.json chose (measured as validate_offline measures them)."""
    epoch = selected["chosen"]["epoch"]
    return next(c for c in selected["candidates"] if c["epoch"] == epoch)


def learning_curve(
    points: Sequence[Mapping[str, Any]],
    shards: int,
    num_speculative_tokens: int,
    output: str | Path,
) -> dict[str, Any]:
    """Rule learning_curve: each point's history, offline.json (and selection.json) -> learning_curve.json.

    Args:
        points: {"shards": k, "fractions", "history", and "selection" (its chosen epoch's figures) or
            "offline"} file paths.
        shards: training shards of the whole run.
        num_speculative_tokens: the k of the trend (validate.num_speculative_tokens).
    """
    rows = []
    for p in points:
        selected = json.loads(Path(p["selection"]).read_text()) if p.get("selection") else None
        offline = chosen_acceptance(selected) if selected else json.loads(Path(p["offline"]).read_text())
        k = max(1, min(num_speculative_tokens, len(offline["acceptance_length"])))
        history = json.loads(Path(p["history"]).read_text())
        rows.append(point(p["shards"], shards, p["fractions"], history, offline, selected, k))
    record = curve_record(rows, k)
    io.write_json(record, output, indent=1)
    trend = record["trend"]
    log.info(
        "learning curve: %s; per doubling of the data: %s",
        [(r["training_tokens"], round(r["mean_accepted_length"], 3)) for r in rows],
        "n/a" if trend is None else f"{trend['per_doubling']:+.3f}",
    )
    return record
