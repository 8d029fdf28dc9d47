"""The generation shard contract, and a lazy scan of many shards in that one schema.

Generation shards are written by `generate_shard` (one row per prompt). Writers may differ in small
ways that do not change meaning (an all-null column stored as Null, token ids as int64): every shard
is cast to `GENERATION_SCHEMA` on read. A missing column or a cast that would lose data is refused
with the shard named.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import polars as pl

STATUSES = ("ok", "skipped", "failed")

GENERATION_SCHEMA: dict[str, pl.DataType] = {
    "id": pl.String(),
    "shard": pl.Int32(),
    "source": pl.String(),
    "row": pl.Int64(),
    "turn": pl.Int32(),
    "system": pl.String(),
    "question": pl.String(),
    "original_answer": pl.String(),
    "reasoning": pl.String(),
    "content": pl.String(),
    "finish_reason": pl.String(),
    "prompt_token_ids": pl.List(pl.Int32()),
    "completion_token_ids": pl.List(pl.Int32()),
    "prompt_tokens": pl.Int32(),
    "completion_tokens": pl.Int32(),
    "status": pl.String(),
    "reason": pl.String(),
    "latency_s": pl.Float64(),
    "max_tokens": pl.Int32(),
    "temperature": pl.Float64(),
    "top_p": pl.Float64(),
    "seed": pl.Int64(),
    "server_identity": pl.String(),
}

SHARD_NAME = re.compile(r"shard-(\d+)\.parquet$")


class TraceError(ValueError):
    """Generation shards that cannot be merged as they are; the message names the shards and the fix."""


def shard_number(path: str | Path) -> int:
    """The shard number k of a file named shard-{k:05d}.parquet.

    Raises:
        TraceError: the file is not named like a generation shard.
    """
    match = SHARD_NAME.search(Path(path).name)
    if match is None:
        raise TraceError(f"{path}: a generation shard must be named shard-NNNNN.parquet")
    return int(match.group(1))


def _check_columns(path: Path, schema: dict[str, pl.DataType]) -> None:
    missing = [name for name in GENERATION_SCHEMA if name not in schema]
    if missing:
        raise TraceError(
            f"generation shard {path} lacks column(s) {missing}: it was written by an older or "
            "different generator; delete it and rerun snakemake to regenerate it"
        )
    for name, want in GENERATION_SCHEMA.items():
        have = schema[name]
        if have == want or have == pl.Null():
            continue
        if want.is_nested() != have.is_nested() or (want == pl.String()) != (have == pl.String()):
            raise TraceError(
                f"generation shard {path}: column {name!r} is {have}, expected {want}; "
                "delete the shard and rerun snakemake to regenerate it"
            )


def _canonical(frame: pl.LazyFrame) -> pl.LazyFrame:
    # strict casts: a value that does not fit (an int64 token id beyond int32) fails the merge
    return frame.select(
        *(pl.col(name).cast(dtype, strict=True) for name, dtype in GENERATION_SCHEMA.items()),
        pl.col("_path").str.extract(SHARD_NAME.pattern, 1).cast(pl.Int32).alias("file_shard"),
    )


def _same_schema_runs(paths: Sequence[Path]) -> list[list[Path]]:
    """Consecutive paths grouped by identical parquet schema (one scan per group, order kept)."""
    runs: list[list[Path]] = []
    last = None
    for path in paths:
        if not path.exists():
            raise TraceError(f"generation shard {path} does not exist; rerun snakemake to generate it")
        schema = pl.read_parquet_schema(path)
        _check_columns(path, schema)
        if schema != last:
            runs.append([])
            last = schema
        runs[-1].append(path)
    return runs


def scan_shards(paths: Sequence[str | Path]) -> pl.LazyFrame:
    """All shards as one lazy frame in the order given, cast to `GENERATION_SCHEMA`.

    Adds `file_shard` (k from the file name) and `_index` (the row's position in the whole
    concatenation, used to keep the first of duplicates). Only parquet footers are read here.

    Raises:
        TraceError: no shards, a badly named, repeated or missing shard, or columns that break
            the contract.
    """
    if not paths:
        raise TraceError("no generation shards to merge; check dataset.num_samples and shard_size")
    paths = [Path(path) for path in paths]
    numbers = [shard_number(path) for path in paths]
    repeated = sorted(k for k, count in Counter(numbers).items() if count > 1)
    if repeated:
        raise TraceError(f"shard number(s) {repeated} given more than once: each shard is merged once")
    frames = [
        _canonical(pl.scan_parquet(run, include_file_paths="_path")) for run in _same_schema_runs(paths)
    ]
    return pl.concat(frames, how="vertical").with_row_index("_index")
