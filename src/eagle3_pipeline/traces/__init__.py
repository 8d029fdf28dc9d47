"""Traces: generation shards merged with polars, every prompt accounted for, filtered, split by id."""

from eagle3_pipeline.traces.filters import split_of
from eagle3_pipeline.traces.merge import TraceOutputs, merge_traces
from eagle3_pipeline.traces.schema import GENERATION_SCHEMA, TraceError
from eagle3_pipeline.traces.shard import filter_shard_traces
from eagle3_pipeline.traces.split import split_traces

__all__ = [
    "GENERATION_SCHEMA",
    "TraceError",
    "TraceOutputs",
    "filter_shard_traces",
    "merge_traces",
    "split_of",
    "split_traces",
]
