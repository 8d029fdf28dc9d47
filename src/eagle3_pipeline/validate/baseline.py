"""The baseline of the experiment: the same training on the dataset's original answers.

The baseline's traces are the training split's rows with the assistant turn replaced by the dataset's
`original_answer` (no thinking) and the token ids dropped, so that hidden-state extraction renders
them through the target's chat template exactly as it would any trace without ids. Everything else
(extraction, vocab map, training, export, validation on the target's own validation outputs) is the
main path's rules on these traces: the draft rules' {variant} baseline/ (rules/common/variants.smk).
"""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from eagle3_pipeline import io

log = logging.getLogger(__name__)


class BaselineError(ValueError):
    """The training traces cannot make a baseline; the message says what to change."""


def baseline_frame(train: pl.DataFrame) -> pl.DataFrame:
    """Rows with content = original_answer, reasoning empty, token ids null; rows without one dropped."""
    if "original_answer" not in train.columns:
        raise BaselineError(
            "traces have no original_answer column (the dataset carries no answers); "
            "set validate.baseline: false"
        )
    kept = train.filter(pl.col("original_answer").fill_null("").str.strip_chars() != "")
    ids = [c for c in ("prompt_token_ids", "completion_token_ids") if c in kept.columns]
    return kept.with_columns(
        pl.col("original_answer").alias("content"),
        pl.lit("").alias("reasoning"),
        *[pl.lit(None, dtype=kept.schema[c]).alias(c) for c in ids],
    )


def write_baseline_traces(train_path: str | Path, output_path: str | Path) -> int:
    """Rule baseline_traces: write one shard's baseline training traces; returns how many rows.

    A shard may hold none (no training row, or none with an original answer): its file is empty.

    Raises:
        BaselineError: the traces carry no original_answer column.
    """
    train = pl.read_parquet(train_path)
    frame = baseline_frame(train)
    if frame.is_empty() and not train.is_empty():
        log.warning(
            "no row of %s has an original_answer: this shard adds nothing to the baseline",
            train_path,
        )
    io.write_parquet(frame, output_path)
    log.info("baseline traces: %d of %d training rows have an original answer", len(frame), len(train))
    return len(frame)
