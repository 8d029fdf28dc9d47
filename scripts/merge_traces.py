"""Rule merge_traces: generation shards -> traces (with their split), stats, conversations, plots."""

from eagle3_pipeline.logs import stage
from eagle3_pipeline.settings import TracesSettings
from eagle3_pipeline.traces import TraceOutputs, merge_traces

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

output = snakemake.output
merge_traces(
    generations=list(snakemake.input.generations),
    server=snakemake.input.server,
    outputs=TraceOutputs(
        output.traces,
        output.stats,
        output.conversations,
        output.lengths_plot,
        output.counts_plot,
    ),
    traces=snakemake.params.runtime.whole(TracesSettings, "traces", snakemake.params.traces),
    prompts=list(snakemake.input.prompts),
)
