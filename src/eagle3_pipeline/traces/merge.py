"""merge_traces: generation shards -> checked, filtered training traces with their split, and accounts.

Passes over the shards, each streaming (polars lazy scans and sinks; memory bounded by a chunk of
rows, not by the corpus):
  1. accounting: counts per shard by status and by drop reason, repeated ids, server identity, and
     (when given) the prompt shards: any mismatch fails before anything is written, and so does a
     share of `failed` rows above traces.max_failed_fraction;
  2. duplicates: the (system, question, thinking, answer) groups that occur more than once in a shard;
  3. traces.parquet: the kept rows, in shard order, with `split`;
then conversations.jsonl and the statistics. Every output is written under a temporary name and
renamed when complete. train.parquet and validation.parquet are cut from traces.parquet by the
split_traces rule (traces/split.py).
"""

from __future__ import annotations

import json
import logging
import resource
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from importlib import metadata
from pathlib import Path
from typing import Any

import polars as pl

from eagle3_pipeline import io
from eagle3_pipeline.io import atomic_path
from eagle3_pipeline.settings import TraceFilters, TracesSettings
from eagle3_pipeline.traces.checks import (
    check_shards,
    cross_shard_repeats,
    duplicate_rows,
    prompt_table,
    repeated_ids,
    shard_table,
)
from eagle3_pipeline.traces.export import write_conversations
from eagle3_pipeline.traces.filters import REASONS, ROW_REASONS, row_reason, split_expr
from eagle3_pipeline.traces.plots import plot_counts, plot_lengths
from eagle3_pipeline.traces.schema import GENERATION_SCHEMA, STATUSES, TraceError, scan_shards
from eagle3_pipeline.traces.stats import trace_stats

log = logging.getLogger(__name__)

_CHUNK_BYTES = 16 << 20  # target decoded size of one streaming chunk / output row group
_DECODED_PER_STORED = 4  # rough ratio of decoded to zstd-compressed bytes for text and token ids
_SAMPLE_SHARDS = 16


@dataclass(frozen=True)
class TraceOutputs:
    """Where merge_traces writes (the merge_traces rule's outputs)."""

    traces: Path
    stats: Path
    conversations: Path
    lengths_plot: Path
    counts_plot: Path

    def __post_init__(self) -> None:
        for field in fields(self):
            object.__setattr__(self, field.name, Path(getattr(self, field.name)))

    @classmethod
    def in_dir(cls, directory: str | Path) -> TraceOutputs:
        """The rule's layout under `directory` (results/{run}/traces)."""
        d = Path(directory)
        return cls(
            d / "traces.parquet",
            d / "stats.json",
            d / "conversations.jsonl",
            d / "plots" / "lengths.png",
            d / "plots" / "counts.png",
        )


def read_identity(path: str | Path) -> str:
    """The server identity hash from server/identity.json ({"identity": hash, "fields": {...}})."""
    try:
        identity = json.loads(Path(path).read_text())["identity"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise TraceError(
            f"{path}: not a server identity file ({error}); rerun the snapshot_server rule"
        ) from error
    if not isinstance(identity, str) or not identity:
        raise TraceError(f"{path}: 'identity' must be a non-empty string; rerun the snapshot_server rule")
    return identity


def chunk_rows(paths: Sequence[str | Path]) -> int:
    """Rows per streaming chunk and output row group, so that one holds about 16 MB decoded.

    Estimated from the stored size per row of a few shards: a thousand 8k-token traces are
    hundreds of MB, so a fixed row count would not bound memory.
    """
    sample = [Path(p) for p in paths[:: max(1, len(paths) // _SAMPLE_SHARDS)]]
    rows = sum(pl.scan_parquet(p).select(pl.len()).collect().item() for p in sample)
    stored = sum(p.stat().st_size for p in sample)
    per_row = _DECODED_PER_STORED * stored / max(rows, 1)
    return int(min(max(_CHUNK_BYTES / max(per_row, 1.0), 64), 65536))


@contextmanager
def _step(name: str) -> Iterator[None]:
    """Log how long a pass took and the process's peak memory after it."""
    start = time.perf_counter()
    yield
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    log.info("%s: %.1f s, peak RSS %.0f MB", name, time.perf_counter() - start, peak_mb)


def _account(
    frame: pl.LazyFrame,
    identity: str,
    traces: TracesSettings,
    generations: Sequence[str | Path],
    prompts: Sequence[str | Path] | None,
) -> pl.DataFrame:
    """Pass 1: the per-shard table; raises TraceError when the shards do not add up."""
    table = shard_table(frame, identity, traces).collect(engine="streaming")
    prompt_counts = prompt_table(prompts) if prompts else None
    check_shards(table, repeated_ids(frame), identity, Path(generations[0]).parent, prompt_counts)
    return table


def check_failed_fraction(table: pl.DataFrame, frame: pl.LazyFrame, limit: float) -> None:
    """Stop when more than `limit` of the prompts failed: naming the count, the worst shards and why.

    A failed row is a request the server refused for good (a 4xx, a malformed reply): a few are
    noise, many mean a config or server problem worth fixing before training on what is left.
    """
    prompts, failed = int(table["rows"].sum()), int(table["failed"].sum())
    if not prompts or failed / prompts <= limit:
        return
    worst = table.sort("failed", descending=True).head(3)
    shards = ", ".join(f"{k:05d}: {n}" for k, n in worst.select("file_shard", "failed").iter_rows() if n)
    reasons = _not_ok_reasons(frame.filter(pl.col("status") == "failed"), limit=3)
    why = "; ".join(f"{r['count']} x {str(r['reason'])[:200]}" for r in reasons)
    raise TraceError(
        f"{failed} of {prompts} prompts failed ({failed / prompts:.2%}), more than "
        f"traces.max_failed_fraction = {limit:.2%}; most failed shards {shards}; reasons: {why}. Fix "
        "the cause, delete those generation shards and rerun (their journals resend only the failed "
        "prompts), or raise traces.max_failed_fraction"
    )


def kept_traces(frame: pl.LazyFrame, traces: TraceFilters, duplicates: pl.DataFrame) -> pl.LazyFrame:
    """The rows that become traces (no drop reason, not a later duplicate), with `split`."""
    return (
        frame.with_columns(row_reason(traces))
        .filter(pl.col("drop_reason").is_null() & ~pl.col("_index").is_in(duplicates["_index"].implode()))
        .select(*GENERATION_SCHEMA, split_expr(traces.validation_fraction))
    )


def _write_traces(kept: pl.LazyFrame, out: TraceOutputs, rows: int) -> None:
    # Each output is its own streaming pass over the shards: one query with several sinks buffers
    # whatever the slowest sink has not taken yet, which made peak memory grow with the corpus.
    # split_traces reads traces.parquet back in its own pass, in chunks of the same row count
    # (benchmarks/merge.py: 10x the rows, 1.5x its peak).
    with _step("traces.parquet"), atomic_path(out.traces) as path:
        kept.sink_parquet(path, row_group_size=rows)
    with _step("conversations.jsonl"), atomic_path(out.conversations) as path:
        write_conversations(kept, path)


def _by_source(frame: pl.LazyFrame) -> dict[str, dict[str, int]]:
    counts = (
        frame.group_by("source", "status")
        .agg(n=pl.len())
        .sort("source", "status")
        .collect(engine="streaming")
    )
    result: dict[str, dict[str, int]] = {}
    for row in counts.to_dicts():
        result.setdefault(str(row["source"]), {})[row["status"]] = row["n"]
    return result


def _not_ok_reasons(frame: pl.LazyFrame, limit: int = 20) -> list[dict[str, Any]]:
    counts = (
        frame.filter(pl.col("status") != "ok")
        .group_by("status", "reason")
        .agg(count=pl.len())
        .sort("count", "status", "reason", descending=[True, False, False])
        .head(limit)
        .collect(engine="streaming")
    )
    return counts.to_dicts()


def _shard_accounts(
    table: pl.DataFrame, duplicates: pl.DataFrame, kept: dict[int, int]
) -> list[dict[str, Any]]:
    """Per shard: prompts = ok + skipped + failed and prompts = kept + dropped (both checked)."""
    dup_counts = dict(duplicates.group_by("file_shard").len().iter_rows())
    shards = []
    for row in table.to_dicts():
        k = row["file_shard"]
        dropped = {name: row[f"drop_{name}"] for name in ROW_REASONS} | {"duplicate": dup_counts.get(k, 0)}
        account = {"shard": k, "prompts": row["rows"], **{s: row[s] for s in STATUSES}}
        account |= {"kept": kept.get(k, 0), "dropped": dropped}
        if account["prompts"] != sum(row[s] for s in STATUSES) or account["prompts"] != account["kept"] + sum(
            dropped.values()
        ):
            raise TraceError(f"shard {k:05d}: the accounts do not add up: {account}")
        shards.append(account)
    return shards


def _package_version() -> str:
    try:
        return metadata.version("eagle3-pipeline")
    except metadata.PackageNotFoundError:  # run from a source tree without installing
        return "unknown"


def _build_stats(
    frame: pl.LazyFrame,
    kept: pl.LazyFrame,
    table: pl.DataFrame,
    duplicates: pl.DataFrame,
    identity: str,
    traces: TracesSettings,
) -> dict[str, Any]:
    """stats.json: the accounts (checked again per shard), drop reasons and the kept traces' figures."""
    kept_stats = trace_stats(kept)
    shards = _shard_accounts(table, duplicates, kept_stats.pop("kept_by_shard"))
    totals = {key: sum(s[key] for s in shards) for key in ("prompts", *STATUSES, "kept")}
    dropped = {name: sum(s["dropped"][name] for s in shards) for name in REASONS}
    return {
        **totals,
        "train": kept_stats["splits"].get("train", 0),
        "validation": kept_stats["splits"].get("validation", 0),
        "dropped": dropped,
        "cross_shard_repeats": cross_shard_repeats(frame, traces) if traces.drop_duplicates else 0,
        "filters": asdict(traces),
        "server_identity": identity,
        "versions": {"polars": pl.__version__, "eagle3_pipeline": _package_version()},
        "by_source": _by_source(frame),
        "not_ok_reasons": _not_ok_reasons(frame),
        **kept_stats,
        "shards": shards,
    }


def merge_traces(
    generations: Sequence[str | Path],
    server: str | Path,
    outputs: TraceOutputs,
    traces: TracesSettings,
    prompts: Sequence[str | Path] | None = None,
) -> dict[str, Any]:
    """Merge, check, filter and split generation shards; write `outputs`; return the statistics.

    Args:
        generations: generations/shard-{k:05d}.parquet, in shard order.
        server: server/identity.json; every row must carry its identity hash.
        outputs: where to write (see TraceOutputs).
        traces: the traces.* settings (filters, split, failed-row limit).
        prompts: prompts/shard-{k:05d}.parquet; when given, each generation shard must hold exactly
            the ids of the prompt shard with the same number.

    Raises:
        TraceError: the shards do not account for every prompt exactly once, come from another
            server, or leave no trace to train on. The message names the shards and the fix.
    """
    identity = read_identity(server)
    frame = scan_shards(generations)
    rows = chunk_rows(generations)
    log.info("merging %d generation shards, %d rows per chunk", len(generations), rows)
    with pl.Config(streaming_chunk_size=rows):
        with _step("accounting"):
            table = _account(frame, identity, traces, generations, prompts)
            check_failed_fraction(table, frame, traces.max_failed_fraction)
        with _step("duplicates"):
            duplicates = duplicate_rows(frame, traces)
        kept = kept_traces(frame, traces, duplicates)
        _write_traces(kept, outputs, rows)
        with _step("statistics"):
            stats = _build_stats(frame, kept, table, duplicates, identity, traces)
    if not stats["kept"]:
        raise TraceError(f"no trace kept out of {stats['prompts']} prompts: dropped {stats['dropped']}")
    if not stats["validation"]:
        log.warning("no trace in validation (traces.validation_fraction %s)", traces.validation_fraction)
    for plot, target in ((plot_lengths, outputs.lengths_plot), (plot_counts, outputs.counts_plot)):
        with atomic_path(target) as path:
            plot(stats, path)
    io.write_json(stats, outputs.stats, indent=1)
    log.info(
        "kept %d of %d prompts (train %d, validation %d); dropped %s",
        stats["kept"],
        stats["prompts"],
        stats["train"],
        stats["validation"],
        stats["dropped"],
    )
    return stats
