"""Figures for people: counts by shard, source, status and drop reason; length distributions.

Token counts: prompt and completion tokens are counted from the server's own token ids. Where the
thinking ends inside the completion (the `</think>` token) is not known without the tokenizer, so
thinking and answer tokens are an estimate: the completion's token count shared in proportion to
the characters of `reasoning` and `content`. Their exact character counts are reported too.
"""

from __future__ import annotations

import math
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
HISTOGRAMS = ("prompt_tokens", "thinking_tokens", "answer_tokens")
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


def _length_summary(row: dict[str, Any]) -> dict[str, dict[str, float]]:
    count = row.pop("count")
    summary: dict[str, dict[str, float]] = {name: {"count": count} for name in LENGTHS}
    for key, value in row.items():
        name, stat = key.split(".")
        summary[name][stat] = round(value, 2) if isinstance(value, float) else value
    return summary


def bin_edges(index: int) -> tuple[int, int]:
    """[low, high) token counts of histogram bin `index` (see _histogram)."""
    return math.ceil(2 ** (index / BINS_PER_OCTAVE) - 1), math.ceil(2 ** ((index + 1) / BINS_PER_OCTAVE) - 1)


def _histogram(lengths: pl.LazyFrame, name: str) -> pl.LazyFrame:
    """Counts in log-spaced bins: bin i holds values x with floor(4 * log2(x + 1)) == i."""
    bins = (pl.col(name).cast(pl.Float64) + 1).log(2).mul(BINS_PER_OCTAVE).floor().cast(pl.Int32).alias("bin")
    return lengths.group_by(bins).agg(count=pl.len()).sort("bin")


def _bins(counts: pl.DataFrame) -> list[dict[str, int]]:
    return [
        {"low": bin_edges(row["bin"])[0], "high": bin_edges(row["bin"])[1], "count": row["count"]}
        for row in counts.to_dicts()
    ]


def _counts(frame: pl.DataFrame, key: str) -> dict[Any, int]:
    return dict(zip(frame[key].to_list(), frame["count"].to_list(), strict=True))


def trace_stats(traces: pl.LazyFrame) -> dict[str, Any]:
    """Length summaries and histograms of the kept traces, and their counts by shard, source and split.

    All aggregations run as one streaming query over the columns they need; their state is a few
    numbers per shard, source and bin, plus one column per length for the exact quantiles.
    """
    lengths = traces.select(length_columns())
    summary = lengths.select(pl.len().alias("count"), *(e for n in LENGTHS for e in _summary_exprs(n)))
    keys = ("shard", "source", "split")
    queries = [summary, *(_histogram(lengths, name) for name in HISTOGRAMS)]
    queries += [traces.group_by(key).agg(count=pl.len()).sort(key) for key in keys]
    queries.append(traces.select((pl.col("finish_reason") == "length").sum()))
    results = pl.collect_all(queries, engine="streaming")
    by = dict(zip(keys, results[1 + len(HISTOGRAMS) : -1], strict=True))
    return {
        "token_counts": TOKEN_COUNT_METHOD,
        "lengths": _length_summary(results[0].to_dicts()[0]),
        "histograms": {name: _bins(r) for name, r in zip(HISTOGRAMS, results[1:], strict=False)},
        "kept_by_shard": _counts(by["shard"], "shard"),
        "kept_by_source": _counts(by["source"], "source"),
        "splits": _counts(by["split"], "split"),
        "kept_truncated": results[-1].item(),
    }
