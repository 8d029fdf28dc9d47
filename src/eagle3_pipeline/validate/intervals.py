"""Question-level bootstrap intervals for acceptance figures.

Drafts within one reply are correlated (a repetitive stretch is accepted throughout; a hard question is
hard at every draft), so the unit of resampling is the question, never the draft: each question
contributes a row of counts, `[denominator, n_1, ..., n_k]` (drafts or anchors, then how many had their
first 1, 2, ..., k tokens accepted), and a figure is computed from the column sums of a resample.

    acceptance length at k = 1 + sum_{i <= k} n_i / denominator

Intervals are percentile intervals over `DRAWS` resamples with a recorded seed, so a rerun over the
same counts gives the same interval. A paired comparison (served against its replay) resamples the same
questions on both sides: question difficulty cancels, what remains is how the two disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

DRAWS = 2000
SEED = 0


def counts_matrix(rows: Sequence[tuple[int, Sequence[int]]]) -> np.ndarray:
    """[questions, 1 + k] int64 from (denominator, per-position counts) rows ([0, 1] with none)."""
    if not rows:
        return np.zeros((0, 1), dtype=np.int64)
    return np.array([[int(d), *map(int, counts)] for d, counts in rows], dtype=np.int64).reshape(
        len(rows), -1
    )


def resamples(questions: int, draws: int = DRAWS, seed: int = SEED) -> np.ndarray:
    """[draws, questions] question indices drawn with replacement."""
    return np.random.default_rng(seed).integers(0, questions, size=(draws, questions))


def acceptance_lengths(sums: np.ndarray) -> np.ndarray:
    """Acceptance length at k = 1..K from column sums [..., 1 + K] (NaN where the denominator is 0)."""
    denominator = sums[..., :1].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rates = np.where(denominator > 0, sums[..., 1:] / denominator, np.nan)
    return 1.0 + np.cumsum(rates, axis=-1)


def position_rates(sums: np.ndarray) -> np.ndarray:
    """Share of drafts whose first i+1 tokens were accepted, per position, from column sums."""
    denominator = sums[..., :1].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator > 0, sums[..., 1:] / denominator, np.nan)


def percentile_interval(values: np.ndarray) -> list[float] | None:
    """The 95% percentile interval of bootstrap draws (non-finite draws left out; None with none)."""
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None
    low, high = np.percentile(values, [2.5, 97.5])
    return [round(float(low), 4), round(float(high), 4)]


def acceptance_interval(
    rows: Sequence[tuple[int, Sequence[int]]], draws: int = DRAWS, seed: int = SEED
) -> dict[str, Any]:
    """The acceptance length at every k with its 95% question-level interval.

    Returns:
        {"acceptance_length": [k=1..K], "ci95": [[lo, hi] per k], "questions", "draws", "seed",
        "unit": "question"}; ci95 entries are None with fewer than 2 questions.
    """
    counts = counts_matrix(rows)
    lengths = acceptance_lengths(counts.sum(axis=0)) if len(counts) else np.array([])
    per_k: list[list[float] | None] = [None] * len(lengths)
    if len(counts) >= 2:
        drawn = acceptance_lengths(counts[resamples(len(counts), draws, seed)].sum(axis=1))
        per_k = [percentile_interval(drawn[:, i]) for i in range(drawn.shape[1])]
    return {
        "acceptance_length": [round(float(x), 4) for x in lengths],
        "ci95": per_k,
        "questions": len(counts),
        "draws": draws,
        "seed": seed,
        "unit": "question",
    }


def paired_differences(
    served: Sequence[tuple[int, Sequence[int]]],
    replayed: Sequence[tuple[int, Sequence[int]]],
    draws: int = DRAWS,
    seed: int = SEED,
) -> dict[str, Any]:
    """Served minus replayed share per position, over the same questions (row i of each is question i),
    with its paired bootstrap standard error and 95% interval.

    Returns:
        {"difference": [...], "standard_error": [...], "ci95": [[lo, hi], ...], "questions", "draws", "seed"}.
    """
    a, b = counts_matrix(served), counts_matrix(replayed)
    if a.shape != b.shape:
        raise ValueError(f"served counts {a.shape} and replayed counts {b.shape} do not pair up")
    difference = position_rates(a.sum(axis=0)) - position_rates(b.sum(axis=0))
    drawn_idx = resamples(len(a), draws, seed)
    drawn = position_rates(a[drawn_idx].sum(axis=1)) - position_rates(b[drawn_idx].sum(axis=1))
    return {
        "difference": [float(x) for x in difference],
        "standard_error": [float(np.nanstd(drawn[:, i])) for i in range(drawn.shape[1])],
        "ci95": [percentile_interval(drawn[:, i]) for i in range(drawn.shape[1])],
        "questions": len(a),
        "draws": draws,
        "seed": seed,
    }


def selection_optimism(
    per_candidate: Sequence[Sequence[tuple[int, Sequence[int]]]], k: int, draws: int = 500, seed: int = SEED
) -> dict[str, Any]:
    """How much choosing the best of several candidates (epochs) on the same questions overstates the
    chosen one's acceptance length at k (Efron's bootstrap optimism): on each resample of the questions
    the best candidate is chosen, and its figure there is compared with its figure on all questions.

    Args:
        per_candidate: per candidate, the per-question rows (the same questions, in the same order).
        k: the draft tokens of the criterion (1-based).

    Returns:
        {"optimism": mean over draws (acceptance length), "ci95", "draws", "seed", "questions"}.
    """
    matrices = [counts_matrix(rows) for rows in per_candidate]
    if len(matrices) < 2 or len(matrices[0]) < 2:
        return {"optimism": 0.0, "ci95": None, "draws": 0, "seed": seed, "questions": len(matrices[0])}
    original = np.array([acceptance_lengths(m.sum(axis=0))[k - 1] for m in matrices])
    drawn_idx = resamples(len(matrices[0]), draws, seed)
    boot = np.stack([acceptance_lengths(m[drawn_idx].sum(axis=1))[:, k - 1] for m in matrices], axis=1)
    chosen = np.nanargmax(boot, axis=1)
    gaps = boot[np.arange(draws), chosen] - original[chosen]
    return {
        "optimism": round(float(np.mean(gaps)), 4),
        "ci95": percentile_interval(gaps),
        "draws": draws,
        "seed": seed,
        "questions": len(matrices[0]),
    }
