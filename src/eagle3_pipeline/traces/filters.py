"""Which rows become training traces, and in which split.

Every row that is not kept gets exactly one reason, the first that applies, in this order:
failed, skipped (the request's status), truncated (finish_reason length; only with
traces.drop_truncated), no_token_ids (the server returned no prompt or completion token ids: nothing
to extract hidden states from), empty (no thinking and no answer; only with traces.drop_empty),
duplicate (same system, question, thinking and answer as an earlier row of the same shard; only with
traces.drop_duplicates). Every reason is decided within one shard, so shard k's traces depend on
generation shard k alone (rule filter_traces); repeats across shards are counted, not dropped.
"""

from __future__ import annotations

import hashlib

import polars as pl

from eagle3_pipeline.settings import TraceFilters

REASONS = ("failed", "skipped", "truncated", "no_token_ids", "empty", "duplicate")
ROW_REASONS = REASONS[:-1]  # decided by the row alone; duplicate needs the whole shard
DEDUP_KEY = ("system", "question", "reasoning", "content")
_BUCKETS = 1 << 64


def _blank(column: str) -> pl.Expr:
    return pl.col(column).fill_null("").str.strip_chars().str.len_bytes() == 0


def row_reason(traces: TraceFilters) -> pl.Expr:
    """Expression: the reason a row is dropped (one of ROW_REASONS), or null when it passes them."""
    status = pl.col("status")
    no_ids = (pl.col("prompt_token_ids").list.len().fill_null(0) == 0) | (
        pl.col("completion_token_ids").list.len().fill_null(0) == 0
    )
    return (
        pl.when(status == "failed")
        .then(pl.lit("failed"))
        .when(status == "skipped")
        .then(pl.lit("skipped"))
        .when(pl.lit(traces.drop_truncated) & (pl.col("finish_reason") == "length"))
        .then(pl.lit("truncated"))
        .when(no_ids)
        .then(pl.lit("no_token_ids"))
        .when(pl.lit(traces.drop_empty) & _blank("reasoning") & _blank("content"))
        .then(pl.lit("empty"))
        .otherwise(pl.lit(None, dtype=pl.String))
        .alias("drop_reason")
    )


def dedup_key() -> list[pl.Expr]:
    """Two independent 64-bit hashes of (system, question, reasoning, content), nulls read as "".

    128 bits: the chance that two different rows among a billion collide is about 1e-21. The hashes
    are only compared within one run, so their instability across polars versions does not matter.
    """
    fields = pl.struct(*(pl.col(name).fill_null("") for name in DEDUP_KEY))
    return [fields.hash(seed=0).alias("_key0"), fields.hash(seed=1).alias("_key1")]


def id_bucket(row_id: str) -> int:
    """A stable 64-bit number for an id: the first 8 bytes of its BLAKE2b digest (big-endian).

    Stable across Python, polars and machines, unlike polars' own hash, so the split of an id
    never changes as long as its id does not.
    """
    return int.from_bytes(hashlib.blake2b(row_id.encode(), digest_size=8).digest(), "big")


def split_of(row_id: str, validation_fraction: float) -> str:
    """ "validation" when the id's bucket falls below validation_fraction of the range, else "train".

    Depends on the id alone: adding rows never moves an existing one, and raising the fraction only
    moves ids from train to validation.
    """
    return "validation" if id_bucket(row_id) < validation_fraction * _BUCKETS else "train"


def _split_batch(ids: pl.Series, validation_fraction: float) -> pl.Series:
    return pl.Series([split_of(row_id, validation_fraction) for row_id in ids], dtype=pl.String)


def split_expr(validation_fraction: float) -> pl.Expr:
    """Expression: the `split` column ("train" or "validation") computed from `id` (see split_of)."""
    return (
        pl.col("id")
        .map_batches(
            lambda ids: _split_batch(ids, validation_fraction), return_dtype=pl.String, is_elementwise=True
        )
        .alias("split")
    )
