"""split_traces: traces.parquet -> train.parquet and validation.parquet, by the `split` column.

A rule of its own so that the split files' producer has one input: each hidden-state shard job
depends on a split, and the cost of finding a producer grows with its input count (planning 10,000
shards). Each split is one streaming pass over traces.parquet; memory is bounded by row groups.
"""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from eagle3_pipeline.config import SPLITS
from eagle3_pipeline.io import atomic_path
from eagle3_pipeline.traces.merge import chunk_rows
from eagle3_pipeline.traces.schema import TraceError

log = logging.getLogger(__name__)


def split_traces(traces: str | Path, train: str | Path, validation: str | Path) -> dict[str, int]:
    """Write the rows of `traces` whose split is train / validation; return the row count of each.

    Raises:
        TraceError: `traces` has no `split` column or a split name other than train/validation.
    """
    frame = pl.scan_parquet(traces)
    if "split" not in frame.collect_schema():
        raise TraceError(f"{traces}: no `split` column; rerun merge_traces")
    counts = dict(frame.group_by("split").len().collect().iter_rows())
    unknown = sorted(set(counts) - set(SPLITS), key=str)
    if unknown:
        raise TraceError(f"{traces}: split values {unknown} are not train/validation; rerun merge_traces")
    rows = chunk_rows([traces])
    for split, target in zip(SPLITS, (train, validation), strict=True):
        with pl.Config(streaming_chunk_size=rows), atomic_path(Path(target)) as path:
            frame.filter(pl.col("split") == split).sink_parquet(path, row_group_size=rows)
        log.info("%s: %d traces", target, counts.get(split, 0))
    return {split: counts.get(split, 0) for split in SPLITS}
