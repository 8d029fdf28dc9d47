"""Figures for people: counts by shard, source, status and drop reason; length distributions.

Token counts: prompt and completion tokens are counted from the server's own token ids. Where the
thinking ends inside the completion (the `</think>` token) is not known without the tokenizer, so
thinking and answer tokens are an estimate: the completion's token count shared in proportion to
the characters of `reasoning` and `content`. Their exact character counts are reported too.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl

LENGTHS = (
    "prompt_tokens",
    "completion_tokens",
    "thinking_tokens",
    "answer_tokens",
    "thinking_chars",
    "answer_chars",
)
TOKEN_COUNT_METHOD = (
    "prompt_tokens and completion_tokens: lengths of the server's token id lists; thinking_tokens and "
    "answer_tokens: completion_tokens shared in proportion to the characters of reasoning and content "
    "(an estimate: the position of </think> is not known without the tokenizer)"
)
BINS_PER_OCTAVE = 4  # histogram bins: quarter powers of two, so no maximum is needed in advance
_QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def length_columns() -> list[pl.Expr]:
    """Expressions for LENGTHS, from the token id lists and texts of a trace."""
    completion = pl.col("completion_token_ids").list.len()
    thinking_chars = pl.col("reasoning").fill_null("").str.len_chars()
    answer_chars = pl.col("content").fill_null("").str.len_chars()
    chars = thinking_chars + answer_chars
    share = pl.when(chars > 0).then(thinking_chars / chars).otherwise(0.0)
    thinking = (completion * share).round().cast(pl.Int64)
    return [
        pl.col("prompt_token_ids").list.len().cast(pl.Int64).alias("prompt_tokens"),
        completion.cast(pl.Int64).alias("completion_tokens"),
        thinking.alias("thinking_tokens"),
        (completion - thinking).cast(pl.Int64).alias("answer_tokens"),
        thinking_chars.cast(pl.Int64).alias("thinking_chars"),
        answer_chars.cast(pl.Int64).alias("answer_chars"),
    ]


def _summary_exprs(name: str) -> list[pl.Expr]:
    col = pl.col(name)
    exprs = [col.mean().alias(f"{name}.mean"), col.min().alias(f"{name}.min"), col.max().alias(f"{name}.max")]
    exprs += [col.quantile(q, "nearest").alias(f"{name}.{label}") for label, q in _QUANTILES.items()]
    return [*exprs, col.sum().alias(f"{name}.sum")]


def length_summary(lengths: pl.LazyFrame) -> dict[str, dict[str, float]]:
    """count, mean, min, p50, p90, p99, max, sum of each of LENGTHS."""
    row = lengths.select(pl.len().alias("count"), *(e for n in LENGTHS for e in _summary_exprs(n)))
    values = row.collect(engine="streaming").to_dicts()[0]
    count = values.pop("count")
    summary: dict[str, dict[str, float]] = {name: {"count": count} for name in LENGTHS}
    for key, value in values.items():
        name, stat = key.split(".")
        summary[name][stat] = round(value, 2) if isinstance(value, float) else value
    return summary


def bin_edges(index: int) -> tuple[int, int]:
    """[low, high) token counts of histogram bin `index` (see histogram)."""
    return math.ceil(2 ** (index / BINS_PER_OCTAVE) - 1), math.ceil(2 ** ((index + 1) / BINS_PER_OCTAVE) - 1)


def histogram(lengths: pl.LazyFrame, name: str) -> list[dict[str, int]]:
    """Counts in log-spaced bins: bin i holds values x with floor(4 * log2(x + 1)) == i."""
    bins = (pl.col(name).cast(pl.Float64) + 1).log(2).mul(BINS_PER_OCTAVE).floor().cast(pl.Int32).alias("bin")
    counts = lengths.group_by(bins).agg(count=pl.len()).sort("bin").collect(engine="streaming")
    return [
        {"low": bin_edges(row["bin"])[0], "high": bin_edges(row["bin"])[1], "count": row["count"]}
        for row in counts.to_dicts()
    ]


def trace_stats(traces_path: str | Path) -> dict[str, Any]:
    """Length summaries and histograms of the kept traces, and their counts by shard, source and split."""
    traces = pl.scan_parquet(traces_path)
    lengths = traces.select(length_columns())
    by = {
        key: traces.group_by(key).agg(count=pl.len()).sort(key).collect(engine="streaming")
        for key in ("shard", "source", "split")
    }
    truncated = traces.select((pl.col("finish_reason") == "length").sum()).collect(engine="streaming").item()
    return {
        "token_counts": TOKEN_COUNT_METHOD,
        "lengths": length_summary(lengths),
        "histograms": {
            name: histogram(lengths, name) for name in ("prompt_tokens", "thinking_tokens", "answer_tokens")
        },
        "kept_by_shard": dict(
            zip(by["shard"]["shard"].to_list(), by["shard"]["count"].to_list(), strict=True)
        ),
        "kept_by_source": dict(
            zip(by["source"]["source"].to_list(), by["source"]["count"].to_list(), strict=True)
        ),
        "splits": dict(zip(by["split"]["split"].to_list(), by["split"]["count"].to_list(), strict=True)),
        "kept_truncated": truncated,
    }
