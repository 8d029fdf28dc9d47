"""The report's selection and learning-curve figures (validation/selection.json,
validation/learning_curve.json), drawn by rule plot_validation beside validate/report.py's pictures."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

from eagle3_pipeline import io  # noqa: E402
from eagle3_pipeline.validate.report import _read_json, _save, figure_text  # noqa: E402

log = logging.getLogger(__name__)


def selection_figure(selection_path: str | Path, output: str | Path) -> None:
    """Offline acceptance length at the served k per kept epoch, the chosen one starred; the training and
    validation loss beside it (they need not agree: the choice is by acceptance)."""
    selection = _read_json(selection_path)
    candidates, chosen, k = selection["candidates"], selection["chosen"], selection["k"]
    epochs = [c["epoch"] + 1 for c in candidates]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    axes[0].plot(epochs, [c["acceptance_length"][k - 1] for c in candidates], "o-", label=f"k = {k}")
    if k < len(candidates[0]["acceptance_length"]):
        axes[0].plot(
            epochs,
            [c["acceptance_length"][-1] for c in candidates],
            "s:",
            alpha=0.6,
            label=f"k = {len(candidates[0]['acceptance_length'])}",
        )
    axes[0].plot(
        [chosen["epoch"] + 1],
        [chosen["acceptance_length"]],
        "r*",
        markersize=16,
        label=f"chosen: epoch {chosen['epoch'] + 1}",
    )
    axes[0].set(
        title="Offline acceptance length per kept epoch", xlabel="epoch", ylabel="tokens per target step"
    )
    axes[0].legend(fontsize=8)
    for key, label in (("train_loss", "train"), ("validation_loss", "validation")):
        rows = [(e, c[key]) for e, c in zip(epochs, candidates, strict=True) if c.get(key) is not None]
        if rows:
            axes[1].plot(*zip(*rows, strict=True), "o-", label=label)
    axes[1].axvline(chosen["epoch"] + 1, color="r", linestyle=":", label="chosen")
    axes[1].set(title="TTT loss at the same epochs", xlabel="epoch")
    axes[1].legend(fontsize=8)
    fig.suptitle(chosen["reason"], fontsize=9)
    _save(fig, output)


def _tokens_label(tokens: float) -> str:
    """6174 -> "6.2k", 2.3e6 -> "2.3M": training tokens on the axis, as counted."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if tokens >= scale:
            return f"{tokens / scale:.3g}{suffix}"
    return f"{tokens:.0f}"


def _error_bars(values: list[float], intervals: list[Any]) -> list[list[float]]:
    """[below, above] distances for errorbar from [low, high] intervals (0 where a point has none)."""
    below = [v - iv[0] if iv else 0.0 for v, iv in zip(values, intervals, strict=True)]
    above = [iv[1] - v if iv else 0.0 for v, iv in zip(values, intervals, strict=True)]
    return [below, above]


def learning_curve_figure(curve_path: str | Path, output: str | Path) -> None:
    """Acceptance length at k against the training tokens of each point (log2 axis labelled in tokens),
    every point at the full draft's optimizer steps, with its 95% question-level interval (offline over
    every anchor; the replayed served run too where measured); the paired gains between consecutive
    points in the title. No fitted line: acceptance length is capped at k + 1."""
    curve = _read_json(curve_path)
    k = curve["k"]
    points: list[dict[str, Any]] = [p for p in curve["points"] if p.get("training_tokens")]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    xs = [p["training_tokens"] for p in points]
    ys = [p["mean_accepted_length"] for p in points]
    ax.errorbar(
        xs,
        ys,
        yerr=_error_bars(ys, [p.get("ci95") for p in points]),
        fmt="o",
        markersize=8,
        capsize=4,
        label="offline, every anchor (95% CI, questions)",
    )
    replayed = [(p["training_tokens"], (p.get("replayed") or {}).get("greedy")) for p in points]
    replayed = [(x, r) for x, r in replayed if r]
    if replayed:
        values = [r["acceptance_length"] for _, r in replayed]
        ax.errorbar(
            [x * 1.03 for x, _ in replayed],  # beside, not on top of, the offline point
            values,
            yerr=_error_bars(values, [r.get("ci95") for _, r in replayed]),
            fmt="s",
            mfc="none",
            markersize=7,
            capsize=3,
            color="tab:orange",
            label="served run replayed, greedy (95% CI)",
        )
    for p in points:
        steps = p.get("optimizer_steps")
        ax.annotate(
            f"{p['shards']} shard{'s' * (p['shards'] > 1)}" + (f", {steps} steps" if steps else ""),
            (p["training_tokens"], p["mean_accepted_length"]),
            textcoords="offset points",
            xytext=(8, -14),
            fontsize=8,
        )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(xs))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _tokens_label(x)))
    ax.xaxis.set_minor_locator(NullLocator())
    if xs:
        ax.set_xlim(min(xs) / 1.4, max(xs) * 1.4)
    compute = curve.get("compute") or {}
    full = compute.get("full_draft_optimizer_steps")
    steps = sorted({p["optimizer_steps"] for p in points if p.get("optimizer_steps")} or ({full} - {None}))
    # the steps as trained (whole shards make them differ by a few percent), not only the target
    if len(steps) > 1:
        compute_text = f"{steps[0]}-{steps[-1]} optimizer steps per point (the full draft's {full})"
    else:
        compute_text = f"every point at {steps[0]} optimizer steps" if steps else "at equal optimizer steps"
    title = f"Acceptance length against training data, {compute_text}"
    gains = [_gain_text(g) for g in curve.get("gains") or []]
    if gains:
        title += "\n" + "\n".join(gains)  # one line each: side by side they ran off the figure
    ax.set(
        title=title,
        xlabel="training tokens (loss tokens of the point's shards, log scale)",
        ylabel=f"acceptance length, k = {k}",
    )
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    metadata = {"Description": json.dumps(figure_text(fig))}
    with io.atomic_path(output) as tmp:  # not _save: its integer ticks would hide the token axis
        fig.savefig(tmp, dpi=110, format="png", metadata=metadata)
    plt.close(fig)


def _gain_text(gain: dict[str, Any]) -> str:
    """ "1 -> 2 shards: +0.12 offline (replayed +0.10 [-0.03, +0.25])": the offline gain, and the replayed
    greedy gain with its paired interval where there is one."""
    text = f"{gain['from_shards']} -> {gain['to_shards']} shards: {gain['gain']:+.2f} offline"
    paired = (gain.get("replayed") or {}).get("greedy")
    if paired and paired.get("ci95"):
        low, high = paired["ci95"]
        text += f" (replayed {paired['gain']:+.2f} [{low:+.2f}, {high:+.2f}])"
    return text


def draw_curves(inputs: dict[str, str | None], outputs: dict[str, str]) -> None:
    """The figures of the curves that the run has (validate.select_every_epochs, validate.learning_curve)."""
    if outputs.get("selection"):
        selection_figure(inputs["selection"], outputs["selection"])
    if outputs.get("learning_curve"):
        learning_curve_figure(inputs["learning_curve"], outputs["learning_curve"])
