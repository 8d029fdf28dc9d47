"""The report's selection and learning-curve figures (validation/selection.json,
validation/learning_curve.json), drawn by rule plot_validation beside validate/report.py's pictures."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from eagle3_pipeline import io  # noqa: E402
from eagle3_pipeline.validate.report import _read_json, _save  # noqa: E402

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


def learning_curve_figure(curve_path: str | Path, output: str | Path) -> None:
    """Acceptance length against training tokens (log2 axis), the fitted trend and its gain per doubling."""
    curve = _read_json(curve_path)
    points: list[dict[str, Any]] = [p for p in curve["points"] if p["training_tokens"]]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [p["training_tokens"] for p in points]
    ax.plot(xs, [p["mean_accepted_length"] for p in points], "o", markersize=8, label="measured (offline)")
    for p in points:
        ax.annotate(
            f"{p['shards']} shard{'s' * (p['shards'] > 1)}",
            (p["training_tokens"], p["mean_accepted_length"]),
            textcoords="offset points",
            xytext=(6, -12),
            fontsize=8,
        )
    trend = curve.get("trend")
    title = "Acceptance length against training data"
    if trend:
        line = sorted(xs)
        fit = [trend["intercept"] + trend["per_doubling"] * math.log2(x) for x in line]
        r2 = "" if trend.get("r2") is None else f", r\u00b2 {trend['r2']:.2f}"
        ax.plot(
            line, fit, "--", color="tab:gray", label=f"trend: {trend['per_doubling']:+.3f} per doubling{r2}"
        )
        title += f"\n{trend['per_doubling']:+.3f} tokens per target step per doubling of the data"
    ax.set_xscale("log", base=2)
    ax.set(
        title=title,
        xlabel="training tokens (loss tokens per epoch)",
        ylabel=f"acceptance length, k = {curve['k']}",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    with io.atomic_path(output) as tmp:  # not _save: its integer ticks would hide a log axis
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def draw_curves(inputs: dict[str, str | None], outputs: dict[str, str]) -> None:
    """The figures of the curves that the run has (validate.select_every_epochs, validate.learning_curve)."""
    if outputs.get("selection"):
        selection_figure(inputs["selection"], outputs["selection"])
    if outputs.get("learning_curve"):
        learning_curve_figure(inputs["learning_curve"], outputs["learning_curve"])
