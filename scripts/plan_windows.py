"""Rule plan_windows: batches per (epoch, window) under a disk cap, for the learning-rate schedule."""

from eagle3_pipeline.draft.window_batches import plan_windows, write_plan
from eagle3_pipeline.logs import stage
from eagle3_pipeline.settings import Batching, Lengths, whole

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

shards = snakemake.params.runtime.section("traces")["shards"]  # input.traces' shard ids, in order
write_plan(
    plan_windows(
        epoch_windows=snakemake.params.windows,
        shard_traces=dict(zip(shards, snakemake.input.traces, strict=True)),
        train=whole(Batching, snakemake.params.train),
        hidden_states=whole(Lengths, snakemake.params.lengths),
    ),
    snakemake.output[0],
)
