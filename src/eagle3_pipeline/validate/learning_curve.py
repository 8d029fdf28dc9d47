"""The learning curve: what more data buys, at equal compute.

validate.learning_curve lists fractions of the training shards; the draft is trained again on the
first k = ceil(fraction x shards) shards of the stable shard order (the {variant}
learning_curve/shards-{k:05d}/ of the draft's rules, on the main draft's hidden states), so the subsets
are nested. k = all the shards is the main draft itself (not trained twice).

Every point trains as many optimizer steps as the full draft: one training epoch of a point reads its
k shards cycled to as many entries as the full draft's samples fill (planning/variants.py
`epoch_entries`: N, or one fewer when the last shard is a small partial one; `cycled_shards`: entry i
is shard i mod k), so an epoch is
about N/k passes over its data and the full draft's batches, and the point trains train.epochs such epochs
under the same learning-rate schedule, keeping (and selecting among) the same epochs as the full
draft. Without it every point trained the same epochs and the smaller ones fewer steps: the curve
measured compute, not data. The steps each point did train (history.json's "step") are recorded with
their ratio to the full draft's; they match as far as the shards hold equal tokens.

Each point's offline acceptance at k (validate.num_speculative_tokens) comes with its question-level
95% interval (offline.json's "ci95"), and the gain from one point to the next with a paired interval:
the points are measured on the same validation questions, so offline.json's served_replay.samples
(the serve check's run replayed along every validation trace, per question) pair up, and a bootstrap
over the questions (validate/intervals.py) gives the gain's interval with question difficulty
cancelled. No straight line is fitted to acceptance length: it is capped (at most k + 1) and bends
toward the cap, so a slope per doubling cannot be extended. At most, with three or more points, the
per-position conditional acceptance rates' log-odds are fitted on log2(training tokens), a scale the
cap does not bend, and reported for the measured range only.

Under hidden_states.max_disk_gb in windows a point extracts nothing of its own: it trains window by
window beside the main draft, each of its windows reading only its own shards among the states the
main draft's window has on disk (planning/windows.py `point_windows`), with its training state carried
from window to window as the main draft's; the cap counts its state files
(planning/state_files.py `state_files_at_once`) and the extraction of the next window waits for it too.
Each shard is read as often per epoch as without a cap.

What the rules plan from validate.learning_curve (the points, their {variant} names, their epochs) is
planning/variants.py's; this module measures the trained points.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from eagle3_pipeline import io
from eagle3_pipeline.validate.intervals import (
    DRAWS,
    SEED,
    acceptance_interval,
    acceptance_lengths,
    counts_matrix,
    paired_differences,
    percentile_interval,
    resamples,
)

log = logging.getLogger(__name__)

COMPUTE_RULE = "equal optimizer steps to the full draft"
# a point's optimizer steps against the full draft's: outside this, the record says the steps differ
STEPS_TOLERANCE = 0.05
FIT_NOTE = "log-odds of the conditional acceptance rates on log2(training tokens), the measured range only"
NO_FIT_NOTE = "no fit: fewer than three points (acceptance length is capped at k + 1; no line is extended)"
REFERENCES = ("greedy", "sampled")  # served_replay's: the target's argmax, the trace's own tokens


def passes_per_epoch(k: int, entries: int) -> list[int]:
    """[fewest, most] times one of the point's k shards is read in one of its training epochs."""
    return [entries // k, -(-entries // k)]


def _logit(rate: float | None) -> float | None:
    if rate is None or not 0 < rate < 1:
        return None
    return math.log(rate / (1 - rate))


def fit_log_odds(
    tokens: Sequence[float], conditional: Sequence[Sequence[float | None]]
) -> dict[str, Any] | None:
    """Per draft position, least squares of the conditional acceptance rate's log-odds on log2(training
    tokens), over the measured range only (no extrapolation: a rate near 1 is where log-odds stretch).

    Args:
        tokens: training tokens per point.
        conditional: per point, the conditional acceptance rate per position (offline.json's).

    Returns:
        None with fewer than three distinct token counts (two points: a line through them says
        nothing more than the points); else the slope per doubling per position (None where a rate is 0,
        1 or missing at some point) and the range the fit holds in.
    """
    xs = [math.log2(t) for t in tokens]
    if len(set(xs)) < 3:
        return None
    positions = min(len(c) for c in conditional)
    slopes: list[float | None] = []
    for i in range(positions):
        ys = [_logit(c[i]) for c in conditional]
        if any(y is None for y in ys):
            slopes.append(None)
            continue
        slope, _ = statistics.linear_regression(xs, [float(y) for y in ys if y is not None])
        slopes.append(round(slope, 4) + 0.0)  # no -0.0
    return {
        "x": "log2(training tokens)",
        "y": "log-odds of the conditional acceptance rate, per draft position",
        "slope_per_doubling": slopes,
        "training_tokens_range": [min(tokens), max(tokens)],
        "points": len(xs),
        "extrapolate": False,
    }


def replay_rows(offline: Mapping[str, Any], reference: str, k: int) -> dict[str, tuple[int, list[int]]]:
    """Per validation question (its id), (drafts, accepted_per_position[:k]) of the served run replayed
    along its trace (offline.json's served_replay.samples) at `reference`; {} when the file has none."""
    samples = (offline.get("served_replay") or {}).get("samples") or {}
    rows = {}
    for question, replay in samples.items():
        counts = (replay or {}).get(reference)
        if counts:
            rows[question] = (int(counts["drafts"]), [int(n) for n in counts["accepted_per_position"][:k]])
    return rows


def _rows(counts: np.ndarray) -> list[tuple[int, list[int]]]:
    return [(row[0], row[1:]) for row in counts.tolist()]


def paired_gain(
    before: Mapping[str, tuple[int, Sequence[int]]],
    after: Mapping[str, tuple[int, Sequence[int]]],
    k: int,
    draws: int = DRAWS,
    seed: int = SEED,
) -> dict[str, Any] | None:
    """The replayed acceptance length at k of `after` minus `before` over the questions both measured,
    with its paired question bootstrap (the same resampled questions on both sides), and the per-position
    differences (intervals.paired_differences). None with fewer than two shared questions."""
    questions = sorted(set(before) & set(after))
    if len(questions) < 2:
        return None
    a = counts_matrix([after[q] for q in questions])
    b = counts_matrix([before[q] for q in questions])
    if a.shape != b.shape or a.shape[1] < k + 1:
        return None
    a, b = a[:, : k + 1], b[:, : k + 1]
    gain = acceptance_lengths(a.sum(axis=0))[k - 1] - acceptance_lengths(b.sum(axis=0))[k - 1]
    drawn_idx = resamples(len(questions), draws, seed)
    drawn = (
        acceptance_lengths(a[drawn_idx].sum(axis=1))[:, k - 1]
        - acceptance_lengths(b[drawn_idx].sum(axis=1))[:, k - 1]
    )
    positions = paired_differences(_rows(a), _rows(b), draws, seed)
    return {
        "gain": round(float(gain), 4) if np.isfinite(gain) else None,
        "ci95": percentile_interval(drawn),
        "standard_error": round(float(np.nanstd(drawn)), 4) if np.isfinite(drawn).any() else None,
        "per_position_rate": {
            "difference": [round(x, 4) for x in positions["difference"]],
            "ci95": positions["ci95"],
        },
        "questions": len(questions),
        "draws": draws,
        "seed": seed,
        "unit": "question",
    }


def replayed_figure(rows: Mapping[str, tuple[int, Sequence[int]]], k: int) -> dict[str, Any] | None:
    """The replayed acceptance length at k over `rows`' questions, with its question-level interval."""
    if not rows:
        return None
    figure = acceptance_interval([rows[q] for q in sorted(rows)])
    if len(figure["acceptance_length"]) < k:
        return None
    return {
        "acceptance_length": figure["acceptance_length"][k - 1],
        "ci95": figure["ci95"][k - 1],
        "questions": figure["questions"],
    }


def point(
    k: int,
    shards: int,
    fractions: Sequence[float],
    history: Sequence[Mapping[str, Any]],
    offline: Mapping[str, Any],
    selected: Mapping[str, Any] | None,
    steps: int,
    training_tokens: int | None = None,
    epochs: int | None = None,
    entries: int | None = None,
) -> dict[str, Any]:
    """One point: its subset, its training (tokens, optimizer steps, passes over its data) and offline
    acceptance with its interval.

    Args:
        history: the point's history.json (per epoch: "step", "train": {"tokens"}).
        offline: its offline figures (offline.json, or the chosen epoch's selection candidate).
        selected: its selection.json (data, not the config), None without checkpoint selection.
        steps: the curve's k (draft tokens).
        training_tokens: the loss tokens of its k shards (hidden-state metadata); None: one epoch's
            loss tokens from its history divided by its passes per epoch (exact when k divides them).
        epochs: train.epochs (its training epochs); None: its history's length.
        entries: shard entries in one of its training epochs (epoch_entries; the full draft's: all its
            shards); None: `shards`.
    """
    chosen = (selected or {}).get("chosen") or {}
    epoch = chosen.get("epoch", len(history) - 1)
    trained = len(history) if epochs is None else epochs
    entries = shards if entries is None or k == shards else entries
    if training_tokens is None and history:
        seen = (history[0].get("train") or {}).get("tokens")
        training_tokens = None if seen is None else round(seen * k / entries)
    at_epoch = next((r for r in history if r.get("epoch") == epoch), {})
    ci95 = offline.get("ci95") or []
    return {
        "fractions": list(fractions),
        "shards": k,
        "fraction_of_shards": k / shards,
        "training_tokens": training_tokens,
        "optimizer_steps": history[-1].get("step") if history else None,
        "epochs": round(trained * entries / k, 3),  # passes over its own data
        "training_epochs": trained,
        "passes_per_epoch": passes_per_epoch(k, entries),
        "epoch": epoch,
        "step": at_epoch.get("step"),  # the chosen epoch's
        "conditional": offline["conditional"],
        "acceptance_length": offline["acceptance_length"],
        "mean_accepted_length": offline["acceptance_length"][steps - 1],
        "ci95": ci95[steps - 1] if len(ci95) >= steps else None,  # at k, question-level
    }


def steps_ratio(point: Mapping[str, Any], full_steps: int | None) -> float | None:
    """A point's optimizer steps over the full draft's (None when either is unknown)."""
    steps = point.get("optimizer_steps")
    return round(steps / full_steps, 4) if full_steps and steps is not None else None


def compute_record(points: Sequence[Mapping[str, Any]], full_steps: int | None) -> dict[str, Any]:
    """How the points' compute was matched, and how well (each point's "steps_ratio")."""
    ratios = [p["steps_ratio"] for p in points if p.get("steps_ratio") is not None]
    return {
        "rule": COMPUTE_RULE,
        "how": "one training epoch of a point reads its k shards cycled to the full draft's shard count "
        "(about N/k passes); train.epochs epochs, the full draft's learning-rate schedule and kept epochs; "
        "under hidden_states.max_disk_gb in windows, a shard's passes of an epoch in the window holding it",
        "full_draft_optimizer_steps": full_steps,
        "tolerance": STEPS_TOLERANCE,
        "within_tolerance": all(abs(r - 1) <= STEPS_TOLERANCE for r in ratios) if ratios else None,
    }


def gains_record(
    points: Sequence[Mapping[str, Any]], replays: Sequence[Mapping[str, Mapping[str, Any]]] | None, k: int
) -> list[dict[str, Any]]:
    """From each point to the next: the offline acceptance length's gain at k, and per reference the
    replayed acceptance length's gain with its paired question interval (or why there is none)."""
    gains = []
    for i in range(1, len(points)):
        before, after = points[i - 1], points[i]
        entry: dict[str, Any] = {
            "from_shards": before["shards"],
            "to_shards": after["shards"],
            "data_ratio": round(after["training_tokens"] / before["training_tokens"], 4)
            if before.get("training_tokens") and after.get("training_tokens")
            else None,
            "gain": round(after["mean_accepted_length"] - before["mean_accepted_length"], 4),
            "gain_ci95": None,
        }
        paired = {}
        if replays:
            for reference in REFERENCES:
                result = paired_gain(replays[i - 1].get(reference, {}), replays[i].get(reference, {}), k)
                if result is not None:
                    paired[reference] = result
        if paired:
            entry["gain_ci95_note"] = (
                "offline.json keeps no per-question counts over every anchor: the paired interval is the "
                "replayed served run's (served_replay.samples), per reference"
            )
            entry["replayed"] = paired
        else:
            entry["gain_ci95_note"] = "no per-question counts shared by both points: no paired interval"
        gains.append(entry)
    return gains


def curve_record(
    points: list[dict[str, Any]],
    k: int,
    gains: list[dict[str, Any]] | None = None,
    compute: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """learning_curve.json: the points (each with its interval), the gains between consecutive points, how
    their compute was matched, and at most a log-odds fit over the measured range (see the module
    docstring: no straight line in acceptance length, no extrapolation)."""
    usable = [p for p in points if p.get("training_tokens") and p.get("conditional")]
    fit = fit_log_odds([p["training_tokens"] for p in usable], [p["conditional"][:k] for p in usable])
    return {
        "metric": f"offline acceptance length at k = {k} draft tokens (validate.num_speculative_tokens)",
        "k": k,
        "compute": compute or {"rule": COMPUTE_RULE},
        "points": points,
        "gains": gains if gains is not None else gains_record(points, None, k),
        "fit": fit,
        "fit_note": FIT_NOTE if fit else NO_FIT_NOTE,
    }


def chosen_acceptance(selected: Mapping[str, Any]) -> dict[str, Any]:
    """The offline figures of the epoch selection.json chose (measured as validate_offline measures them)."""
    epoch = selected["chosen"]["epoch"]
    return next(c for c in selected["candidates"] if c["epoch"] == epoch)


def metadata_tokens(paths: Sequence[str | Path]) -> list[int]:
    """Loss tokens per training shard (hidden-state metadata's num_loss_tokens), in `paths`' order."""
    return [int(json.loads(Path(p).read_text())["num_loss_tokens"]) for p in paths]


def learning_curve(
    points: Sequence[Mapping[str, Any]],
    shards: int,
    num_speculative_tokens: int,
    output: str | Path,
    full_history: str | Path | None = None,
    metadata: Sequence[str | Path] = (),
    epochs: int | None = None,
    entries: int | None = None,
) -> dict[str, Any]:
    """Rule learning_curve: each point's history, offline.json (and selection.json) -> learning_curve.json.

    Args:
        points: {"shards": k, "fractions", "history", "offline" and, with selection, "selection"} file
            paths; the offline figures are offline.json's (the chosen epoch's export), else the chosen
            candidate's in selection.json.
        shards: training shards of the whole run.
        num_speculative_tokens: the curve's k (validate.num_speculative_tokens).
        full_history: the full draft's history.json (the optimizer steps every point matches).
        metadata: the training shards' hidden-state metadata, in shard order (each point's training
            tokens are its first k shards'); empty: estimated from the histories.
        epochs: train.epochs.
        entries: shard entries in one training epoch of a smaller point (epoch_entries); None: `shards`.
    """
    tokens = metadata_tokens(metadata) if metadata else []
    rows, replays = [], []
    k = num_speculative_tokens
    for p in sorted(points, key=lambda p: p["shards"]):
        selected = json.loads(Path(p["selection"]).read_text()) if p.get("selection") else None
        offline = (
            json.loads(Path(p["offline"]).read_text())
            if p.get("offline")
            else chosen_acceptance(selected or {})
        )
        k = max(1, min(num_speculative_tokens, len(offline["acceptance_length"])))
        history = json.loads(Path(p["history"]).read_text())
        own = sum(tokens[: p["shards"]]) if len(tokens) >= p["shards"] else None
        row = point(p["shards"], shards, p["fractions"], history, offline, selected, k, own, epochs, entries)
        replay = {reference: replay_rows(offline, reference, k) for reference in REFERENCES}
        row["replayed"] = {r: replayed_figure(rows_, k) for r, rows_ in replay.items() if rows_} or None
        rows.append(row)
        replays.append(replay)
    full = json.loads(Path(full_history).read_text()) if full_history else []
    full_steps = full[-1].get("step") if full else None
    for row in rows:
        row["steps_ratio"] = steps_ratio(row, full_steps)
    record = curve_record(rows, k, gains_record(rows, replays, k), compute_record(rows, full_steps))
    io.write_json(record, output, indent=1)
    log.info(
        "learning curve at %s: %s; gains %s",
        COMPUTE_RULE,
        [
            (r["shards"], r["training_tokens"], r["optimizer_steps"], round(r["mean_accepted_length"], 3))
            for r in rows
        ],
        [
            (g["to_shards"], g["gain"], (g.get("replayed") or {}).get("greedy", {}).get("ci95"))
            for g in record["gains"]
        ],
    )
    if record["compute"]["within_tolerance"] is False:
        log.warning(
            "the points' optimizer steps differ from the full draft's (%s) by more than %.0f%%: %s",
            full_steps,
            100 * STEPS_TOLERANCE,
            {r["shards"]: r["steps_ratio"] for r in rows},
        )
    return record
