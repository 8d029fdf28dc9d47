"""filter_traces: one generation shard -> its checked, filtered traces, one file per split.

The same checks (those a single shard can fail), filters and split as merge_traces, over one shard:
shard k's traces, and so its hidden states, depend on generation shard k, its prompt shard and the
server identity alone, never on the other shards. Adding shards leaves every done shard's traces (and
hidden states) alone; merge_traces still checks the corpus as a whole (ids repeated across shards),
writes traces.parquet (the union of these files), the statistics and conversations.jsonl.
"""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from eagle3_pipeline.config import SPLITS
from eagle3_pipeline.io import atomic_path
from eagle3_pipeline.settings import TraceFilters
from eagle3_pipeline.traces.checks import (
    check_shards,
    duplicate_rows,
    prompt_table,
    repeated_ids,
    shard_table,
)
from eagle3_pipeline.traces.merge import chunk_rows, kept_traces, read_identity
from eagle3_pipeline.traces.schema import scan_shards

log = logging.getLogger(__name__)


def filter_shard_traces(
    generation: str | Path,
    prompts: str | Path,
    server: str | Path,
    traces: TraceFilters,
    outputs: dict[str, str | Path],
) -> dict[str, int]:
    """Check, filter and split one generation shard; write each split's kept rows; return their counts.

    Args:
        generation: generations/shard-{k:05d}.parquet.
        prompts: prompts/shard-{k:05d}.parquet: the generation shard must hold exactly its ids.
        server: server/identity.json; every row must carry its identity hash.
        traces: the traces.* filters and split (the failed-row limit is the merge's).
        outputs: split name -> traces/shards/{split}/shard-{k:05d}.parquet (every split of SPLITS).

    Raises:
        TraceError: the shard does not account for every prompt exactly once, comes from another
            server, or breaks the column contract. The message names the fix.
    """
    if set(outputs) != set(SPLITS):
        raise ValueError(f"outputs must name every split {SPLITS}, got {sorted(outputs)}")
    identity = read_identity(server)
    frame = scan_shards([generation])
    table = shard_table(frame, identity, traces).collect()
    check_shards(table, repeated_ids(frame), identity, Path(generation).parent, prompt_table([prompts]))
    kept = kept_traces(frame, traces, duplicate_rows(frame, traces))
    rows = chunk_rows([generation])
    counts = {}
    for split in SPLITS:
        with pl.Config(streaming_chunk_size=rows), atomic_path(Path(outputs[split])) as path:
            kept.filter(pl.col("split") == split).sink_parquet(path, row_group_size=rows)
        counts[split] = pl.scan_parquet(outputs[split]).select(pl.len()).collect().item()
    log.info("%s: %d rows, kept %s", generation, table["rows"].sum(), counts)
    return counts
