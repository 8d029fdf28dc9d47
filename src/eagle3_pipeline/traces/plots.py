"""PNG plots of the trace statistics for the report (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

_TITLES = {
    "prompt_tokens": "prompt",
    "thinking_tokens": "thinking (estimated)",
    "answer_tokens": "answer (estimated)",
}


def plot_lengths(stats: dict[str, Any], path: str | Path) -> None:
    """Histograms (log-spaced bins) of prompt, thinking and answer tokens of the kept traces."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), constrained_layout=True)
    for ax, (name, title) in zip(axes, _TITLES.items(), strict=True):
        bins = stats["histograms"][name]
        lows = [b["low"] + 1 for b in bins]  # +1: a log axis cannot show 0 tokens
        widths = [max(b["high"] - b["low"], 1) for b in bins]
        ax.bar(lows, [b["count"] for b in bins], width=widths, align="edge", color="#4c72b0")
        summary = stats["lengths"][name]
        ax.set_xscale("log")
        ax.set_title(f"{title}: p50 {summary.get('p50')}, p99 {summary.get('p99')}")
        ax.set_xlabel("tokens + 1")
    axes[0].set_ylabel("traces")
    fig.suptitle(f"Token lengths of {stats['kept']:,} kept traces")
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)


def plot_counts(stats: dict[str, Any], path: str | Path) -> None:
    """Prompts by source and status (with the kept traces), and rows dropped by reason."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4), constrained_layout=True)
    sources = sorted(stats["by_source"])
    base = [0] * len(sources)
    for status, color in (("ok", "#55a868"), ("skipped", "#ccb974"), ("failed", "#c44e52")):
        counts = [stats["by_source"][s].get(status, 0) for s in sources]
        left.barh(sources, counts, left=base, color=color, label=status)
        base = [b + c for b, c in zip(base, counts, strict=True)]
    kept = [stats["kept_by_source"].get(s, 0) for s in sources]
    left.scatter(kept, sources, marker="|", s=400, color="black", label="kept", zorder=3)
    left.set_title("prompts by source and status")
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.06), ncols=4, frameon=False)
    reasons = {reason: n for reason, n in stats["dropped"].items() if n}
    right.set_title(f"dropped by reason ({sum(reasons.values()):,} of {stats['prompts']:,} prompts)")
    if reasons:
        right.barh(list(reasons), list(reasons.values()), color="#8172b2")
    else:  # in words, not an empty panel on a -0.04..0.04 axis
        right.text(0.5, 0.5, "no prompt dropped", transform=right.transAxes, ha="center", va="center")
        right.set_axis_off()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
