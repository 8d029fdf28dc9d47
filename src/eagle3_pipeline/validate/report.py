"""The pictures of `snakemake --report`: the server snapshot, trace lengths, training curves, acceptance
per position and the trained-vs-baseline comparison. matplotlib with the Agg backend (no display).

Every function reads finished pipeline outputs and writes one file; a missing optional input (no
serve check, no baseline) gives a figure that says so instead of failing the report.
"""

from __future__ import annotations

import html
import json
import logging
import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from eagle3_pipeline import io
from eagle3_pipeline.server_json import ServerSnapshot

log = logging.getLogger(__name__)

SERVER_KEYS = (
    "model",
    "served_model_name",
    "source_host",
    "unit",
    "base_url",
    "tensor_parallel_size",
    "max_model_len",
    "reasoning_parser",
    "tool_call_parser",
    "vllm_version",
)


# Three panels one above the other, each the width of a two-panel row: a 1 x 3 row shrank to fit the
# report's pane until its legends were about 5 px high.
STACKED_3 = (8, 12)


def _read_json(path: str | Path | None) -> Any:
    return json.loads(Path(path).read_text()) if path and Path(path).exists() else None


def figure_text(fig: plt.Figure) -> list[dict[str, Any]]:
    """What each panel of a figure says in words: title, axis labels, legend entries, text drawn on it.
    Written into the PNG's `Description` text chunk (tests/support/figures.py reads it back), so that a
    test or a reader checks what a picture claims, not only that it exists."""
    panels = []
    for ax in fig.axes:
        legend = ax.get_legend()
        panels.append(
            {
                "title": ax.get_title(),
                "xlabel": ax.get_xlabel(),
                "ylabel": ax.get_ylabel(),
                "legend": [t.get_text() for t in legend.get_texts()] if legend else [],
                "texts": [t.get_text() for t in ax.texts],
            }
        )
    return panels


def _save(fig: plt.Figure, path: str | Path) -> None:
    for ax in fig.axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs, positions, k, tokens
    fig.tight_layout()
    kind = Path(path).suffix.lstrip(".") or "png"
    metadata = {"Description": json.dumps(figure_text(fig))} if kind == "png" else None
    with io.atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format=kind, metadata=metadata)
    plt.close(fig)


def _table(rows: list[tuple[str, Any]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def _flatten(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(data, dict):
        return [row for k, v in data.items() for row in _flatten(v, f"{prefix}{k}.")]
    return [(prefix.rstrip("."), data)]


PAGE = (
    "<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title><style>"
    "body{{font-family:sans-serif;margin:1em}}th{{text-align:left;padding-right:1em;vertical-align:top}}"
    "pre{{background:#f4f4f4;padding:.8em;overflow-x:auto}}</style></head><body><h2>{title}</h2>{body}</body></html>"
)


def server_page(unit_path: str | Path, server_json_path: str | Path, output: str | Path) -> None:
    """HTML: the main server.json fields, the vLLM flags, and the redacted unit text as captured."""
    path = Path(server_json_path)
    server = ServerSnapshot.load(path) if path.exists() else ServerSnapshot()
    body = _table(list(server.stated(SERVER_KEYS).items()))
    body += "<h3>vLLM flags</h3>" + _table(sorted(server.args.items()))
    body += "<h3>Environment (secrets redacted)</h3>" + _table(sorted(server.env.items()))
    body += f"<h3>Unit (systemctl cat, redacted)</h3><pre>{html.escape(Path(unit_path).read_text())}</pre>"
    io.write_text(PAGE.format(title="Server snapshot", body=body), output)


def trace_stats_page(stats_path: str | Path, output: str | Path) -> None:
    """HTML: every figure of traces/stats.json as a table."""
    body = _table(_flatten(_read_json(stats_path) or {}))
    io.write_text(PAGE.format(title="Trace statistics", body=body), output)


def trace_lengths(traces_path: str | Path, output: str | Path) -> None:
    """Histograms of prompt and completion tokens (by finish reason) and thinking vs answer length."""
    frame = pl.read_parquet(traces_path)
    fig, axes = plt.subplots(3, 1, figsize=STACKED_3)
    if "prompt_tokens" in frame.columns:
        axes[0].hist(frame["prompt_tokens"].drop_nulls().to_list(), bins=30, color="tab:gray")
    axes[0].set(title="Prompt tokens", xlabel="tokens", ylabel="traces")
    if "completion_tokens" in frame.columns:
        by = (
            frame.partition_by("finish_reason", as_dict=True)
            if "finish_reason" in frame.columns
            else {("all",): frame}
        )
        for key, part in sorted(by.items(), key=lambda kv: str(kv[0])):
            axes[1].hist(
                part["completion_tokens"].drop_nulls().to_list(), bins=30, alpha=0.6, label=str(key[0])
            )
        axes[1].legend(title="finish_reason")
    axes[1].set(title="Completion tokens (thinking + answer)", xlabel="tokens", ylabel="traces")
    if {"reasoning", "content"} <= set(frame.columns):
        chars = frame.select(
            pl.col("reasoning").fill_null("").str.len_chars().alias("r"),
            pl.col("content").fill_null("").str.len_chars().alias("c"),
        )
        axes[2].scatter(chars["r"].to_list(), chars["c"].to_list(), s=8, alpha=0.6)
        top = max([*chars["r"].to_list(), *chars["c"].to_list(), 1])
        axes[2].plot([0, top], [0, top], "k--", linewidth=1, label="answer = thinking")
        axes[2].legend()
    axes[2].set(title="Thinking vs answer", xlabel="thinking characters", ylabel="answer characters")
    fig.suptitle(f"{len(frame)} traces")
    _save(fig, output)


def training_curves(
    history_path: str | Path, output: str | Path, baseline_path: str | Path | None = None
) -> None:
    """Loss, simulated acceptance length and per-step accuracy by epoch (train and validation)."""
    fig, axes = plt.subplots(3, 1, figsize=STACKED_3)
    for label, path, style in (("trained", history_path, "-"), ("baseline", baseline_path, ":")):
        history = _read_json(path)
        if not history:
            continue
        epochs = [r["epoch"] + 1 for r in history]
        for split, color in (("train", "tab:blue"), ("validation", "tab:orange")):
            rows = [r.get(split) for r in history]
            if not any(rows):
                continue
            xs = [e for e, r in zip(epochs, rows, strict=True) if r]
            rows = [r for r in rows if r]
            axes[0].plot(xs, [r["loss"] for r in rows], style, color=color, label=f"{label} {split}")
            axes[1].plot(
                xs,
                [r["simulated_acceptance_length"] for r in rows],
                style,
                color=color,
                label=f"{label} {split}",
            )
        last = next((r.get("validation") or r.get("train") for r in reversed(history)), None)
        if last:
            steps = range(1, len(last["step_accuracy"]) + 1)
            axes[2].plot(steps, last["step_accuracy"], style + "o", label=f"{label} accuracy")
            axes[2].plot(steps, last["conditional_accuracy"], style + "s", label=f"{label} conditional")
    axes[0].set(title="TTT loss (weighted over steps)", xlabel="epoch", ylabel="loss")
    axes[1].set(
        title="Simulated acceptance length (teacher-forced)", xlabel="epoch", ylabel="tokens per target step"
    )
    axes[2].set(title="Per-step accuracy, last epoch", xlabel="draft step", ylabel="accuracy", ylim=(0, 1))
    for ax in axes:
        if ax.lines:
            ax.legend(fontsize=8)
    _save(fig, output)


def _bars(ax: plt.Axes, series: dict[str, list[float | None]], title: str) -> None:
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        xs = [k + 1 + (i - (len(series) - 1) / 2) * width for k in range(len(values))]
        ax.bar(xs, [v or 0.0 for v in values], width=width, label=label)
    ax.set(title=title, xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1))
    if series:
        ax.legend(fontsize=8)


def acceptance(offline_path: str | Path, serve_path: str | Path | None, output: str | Path) -> None:
    """Acceptance per position (offline and served, with the serve check's allowance), acceptance length
    against k, and the served acceptance length by dataset source with the served speedup."""
    offline, served = _read_json(offline_path), _read_json(serve_path)
    fig, axes = plt.subplots(3, 1, figsize=STACKED_3)
    _served_vs_offline(axes[0], offline, served)
    ks = range(1, len(offline["acceptance_length"]) + 1)
    intervals = offline.get("ci95") or [None] * len(ks)
    axes[1].errorbar(
        ks,
        offline["acceptance_length"],
        yerr=[
            [a - (c or [a, a])[0] for a, c in zip(offline["acceptance_length"], intervals, strict=True)],
            [(c or [a, a])[1] - a for a, c in zip(offline["acceptance_length"], intervals, strict=True)],
        ],
        fmt="o-",
        capsize=3,
        label="offline (simulated, greedy, every anchor)",
    )
    runs = [
        (served or {}, "r*", 14, "greedy"),
        ((served or {}).get("sampled") or {}, "mP", 11, "generation's sampling"),
    ]
    for run, marker, size, name in runs:
        if run.get("acceptance_length") is not None:
            value, interval = run["acceptance_length"], run.get("ci95")
            axes[1].errorbar(
                [served["num_speculative_tokens"]],
                [value],
                yerr=[[value - interval[0]], [interval[1] - value]] if interval else None,
                fmt=marker,
                markersize=size,
                capsize=4,
                label=f"served by vLLM, {name}: {value:.2f}" + (_ci_text(interval) if interval else ""),
            )
    _served_by_k(axes[1], (served or {}).get("by_k") or {})
    axes[1].set(
        title="Acceptance length (tokens per target step)",
        xlabel="draft tokens k",
        ylabel="tokens per target step",
        ylim=(1, None),
    )
    axes[1].legend(fontsize=8)
    _by_source(axes[2], served)
    _save(fig, output)


def _served_by_k(ax: plt.Axes, by_k: dict[str, Any]) -> None:
    """validate.by_k_max: the served curve (greedy and sampled) with its intervals, beside the offline one."""
    ks = sorted(int(k) for k in by_k if k.isdigit())
    for run, style in (("greedy", "s--"), ("sampled", "d:")):
        points = [(k, by_k[str(k)][run]) for k in ks if by_k[str(k)].get(run, {}).get("acceptance_length")]
        if len(points) < 2:
            continue
        values = [p["acceptance_length"] for _, p in points]
        errors = [
            [v - (p.get("ci95") or [v, v])[0] for v, (_, p) in zip(values, points, strict=True)],
            [(p.get("ci95") or [v, v])[1] - v for v, (_, p) in zip(values, points, strict=True)],
        ]
        ax.errorbar(
            [k for k, _ in points], values, yerr=errors, fmt=style, capsize=3, label=f"served, {run}, by k"
        )


def _ci_text(interval: list[float]) -> str:
    return f" [{interval[0]:.2f}, {interval[1]:.2f}]"


def _served_vs_offline(ax: plt.Axes, offline: dict[str, Any], served: dict[str, Any] | None) -> None:
    """Share of drafts whose first i+1 tokens were accepted: offline over every anchor, and each served
    run (greedy, at the generation's sampling) beside its offline replay, the checked pair with its
    allowance."""
    anchors = offline.get("anchors") or 0
    series = {
        "offline, every anchor": [c / anchors if anchors else None for c in offline.get("prefix_counts", [])]
    }
    served = served or {}
    pairs = [served.get("offline_comparison"), served.get("sampled_comparison")]
    comparison = enforced_comparison(served)
    for figures in pairs:
        if figures and figures.get("reference"):
            series[f"replayed, {figures['reference']}"] = [p["offline"] for p in figures["positions"]]
            series[f"served, {figures['reference']}"] = [p["served"] for p in figures["positions"]]
    if served and not (comparison and comparison.get("reference")):
        series["served"] = served["per_position_rate"]
    _bars(ax, series, "First i+1 draft tokens accepted")
    if comparison:
        name = (
            f"replayed, {comparison['reference']}" if comparison.get("reference") else "offline, every anchor"
        )
        offset = (list(series).index(name) - (len(series) - 1) / 2) * 0.8 / len(series)
        for p in comparison["positions"]:
            # on the offline bar of the checked pair: the band the served bar must fall in
            ax.errorbar(
                p["position"] + 1 + offset, p["offline"], yerr=p["allowed"], fmt="none", ecolor="k", capsize=4
            )
        verdict = "agree" if comparison["agree"] else "DISAGREE"
        which = comparison.get("reference") or "served"
        title = f"First i+1 draft tokens accepted\nchecked pair ({which}) {verdict} (whiskers: allowed)"
        for other in (p for p in pairs if p and p is not comparison and not p.get("enforced")):
            state = "agree" if other.get("agree") else "DISAGREE"
            title += f"\n{other.get('reference') or 'other'} pair (diagnostic, not enforced) {state}"
        ax.set_title(title)


def enforced_comparison(served: dict[str, Any]) -> dict[str, Any] | None:
    """The matched comparison that decided the serve check (its "enforced" flag), else the first one."""
    pairs = [served.get("sampled_comparison"), served.get("offline_comparison")]
    pairs = [p for p in pairs if p]
    return next((p for p in pairs if p.get("enforced")), pairs[-1] if pairs else None)


def _by_source(ax: plt.Axes, served: dict[str, Any] | None) -> None:
    """Served acceptance length per dataset source; the served speedup in the title."""
    by_source = (served or {}).get("by_source") or {}
    if not by_source:
        ax.text(0.5, 0.5, "no served check by source", transform=ax.transAxes, ha="center")
        ax.set_axis_off()
        return
    names = list(by_source)
    values = [by_source[n].get("acceptance_length") or 1.0 for n in names]
    ax.bar(range(len(names)), values, color="tab:green")
    ax.set_xticks(range(len(names)), names)
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.2f}", ha="center", va="bottom")
    figures = (served or {}).get("speedup") or {}
    title = "Served acceptance length by source (greedy)"
    if figures.get("speedup") is not None:
        at = f" at concurrency {figures['concurrency']}" if figures.get("concurrency") else ""
        title += f"\nspeedup {figures['speedup']:.2f}x{at}"
        rates = figures["tokens_per_s_with_draft"], figures["tokens_per_s_without_draft"]
        title += " ({:.0f} vs {:.0f} tok/s)".format(*rates)
    ax.set(title=title, ylabel="tokens per target step", ylim=(1, None))


def comparison(
    offline_path: str | Path,
    serve_path: str | Path | None,
    baseline_offline: str | Path | None,
    baseline_serve: str | Path | None,
    output: str | Path,
    init_offline: str | Path | None = None,
) -> None:
    """Draft trained on the target's own outputs vs the baseline trained on the dataset's answers, and
    with draft.init_from the draft both started from (offline only: it is not served)."""
    runs = {
        "target's own traces": (offline_path, serve_path),
        "dataset answers (baseline)": (baseline_offline, baseline_serve),
        "starting draft (draft.init_from)": (init_offline, None),
    }
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    series = {}
    for label, (off, srv) in runs.items():
        offline, served = _read_json(off), _read_json(srv)
        if offline:
            lengths = offline["acceptance_length"]
            # in words too: the starting draft (offline only) beside the drafts trained from it
            at_k = f"{lengths[-1]:.2f} at k = {len(lengths)}"
            axes[0].plot(range(1, len(lengths) + 1), lengths, "o-", label=f"{label}, offline: {at_k}")
            series[label] = offline["conditional"]
        if served and served.get("acceptance_length") is not None:
            axes[0].plot(
                [served["num_speculative_tokens"]],
                [served["acceptance_length"]],
                "*",
                markersize=14,
                label=f"{label}, served: {served['acceptance_length']:.2f}",
            )
    if not (baseline_offline and _read_json(baseline_offline)):
        axes[0].text(
            0.5, 0.5, "no baseline (validate.baseline: false)", transform=axes[0].transAxes, ha="center"
        )
    axes[0].set(
        title="Acceptance length on the target's own outputs", xlabel="draft tokens k", ylim=(1, None)
    )
    axes[0].legend(fontsize=8)
    _bars(axes[1], series, "Offline conditional acceptance per position")
    _save(fig, output)


def _slice_order(name: str) -> tuple[int, str]:
    """Context buckets by their first token count ("context 64-128" after "context 0-64", not by the
    text offline.json's sorted keys give), then thinking before answer."""
    bucket = re.match(r"context (\d+)", name)
    return (int(bucket.group(1)), name) if bucket else (0, {"thinking": "0", "answer": "1"}.get(name, name))


def slices(offline_path: str | Path, serve_path: str | Path | None, output: str | Path) -> None:
    """Offline acceptance length at the served k by context-length bucket and by thinking vs answer,
    against the target's argmax (greedy) and the trace's sampled tokens, with the served figures (greedy
    and at the generation's sampling, over all questions) as lines."""
    offline, served = _read_json(offline_path), _read_json(serve_path) or {}
    k = served.get("num_speculative_tokens") or (offline.get("served_replay") or {}).get(
        "num_speculative_tokens"
    )
    by_reference = offline.get("slices") or {}
    fig, axes = plt.subplots(1, 2, figsize=(14, 4), sharey=True)
    for ax, title, chosen in (
        (axes[0], "By context length (tokens read, prompt included)", lambda n: n.startswith("context ")),
        (axes[1], "Thinking vs answer", lambda n: n in ("thinking", "answer")),
    ):
        names = sorted((n for n in (by_reference.get("greedy") or {}) if chosen(n)), key=_slice_order)
        if not names or not k:
            ax.text(
                0.5, 0.5, "not measured (no slices or no think tokens)", transform=ax.transAxes, ha="center"
            )
            ax.set(title=title)
            continue
        for i, reference in enumerate(("greedy", "sampled")):
            figures = [by_reference[reference][n] for n in names]
            xs = [j + (i - 0.5) * 0.4 for j in range(len(names))]
            values = [f["acceptance_length"][k - 1] if f["anchors"] else 1.0 for f in figures]
            ax.bar(xs, values, width=0.4, label=f"offline, {reference}")
            for x, v, f in zip(xs, values, figures, strict=True):
                ax.text(x, v, f"{v:.2f}\n({f['anchors']})", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(names)), [n.removeprefix("context ") for n in names])
        for label, figure, style in (
            ("served, greedy", served, "--"),
            ("served, sampled", served.get("sampled"), ":"),
        ):
            if figure and figure.get("acceptance_length") is not None:
                ax.axhline(
                    figure["acceptance_length"],
                    linestyle=style,
                    color="k",
                    label=f"{label}: {figure['acceptance_length']:.2f}",
                )
        ax.set(title=title, ylabel=f"acceptance length at k = {k}", ylim=(1, k + 1.3))
        ax.legend(fontsize=8, loc="upper right")
    _save(fig, output)


def draw_report(inputs: dict[str, str | None], outputs: dict[str, str]) -> None:
    """Rule plot_validation: every picture of the report (see the rule for the names)."""
    server_page(inputs["unit"], inputs["server"], outputs["server"])
    trace_stats_page(inputs["stats"], outputs["trace_stats"])
    trace_lengths(inputs["traces"], outputs["trace_lengths"])
    training_curves(inputs["history"], outputs["training"], inputs.get("baseline_history"))
    acceptance(inputs["offline"], inputs.get("serve_check"), outputs["acceptance"])
    slices(inputs["offline"], inputs.get("serve_check"), outputs["slices"])
    comparison(
        inputs["offline"],
        inputs.get("serve_check"),
        inputs.get("baseline_offline"),
        inputs.get("baseline_serve_check"),
        outputs["comparison"],
        inputs.get("offline_init"),  # draft.init_from: the starting draft, offline
    )
    log.info("report figures written: %s", sorted(outputs.values()))
