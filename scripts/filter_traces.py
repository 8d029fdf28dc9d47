"""Rule filter_traces: generation shard k -> its checked, filtered traces, one file per split."""

from eagle3_pipeline.logs import stage
from eagle3_pipeline.settings import TraceFilters, whole
from eagle3_pipeline.traces import filter_shard_traces

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

filter_shard_traces(
    generation=snakemake.input.generation,
    prompts=snakemake.input.prompts,
    server=snakemake.input.server,
    traces=whole(TraceFilters, snakemake.params.traces),
    outputs={"train": snakemake.output.train, "validation": snakemake.output.validation},
)
