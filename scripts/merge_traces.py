"""Rule merge_traces: generation shards -> traces, train/validation split, stats, conversations."""

import logging
import sys

from eagle3_pipeline.traces import TraceFilters, TraceOutputs, merge_traces

logging.basicConfig(
    filename=snakemake.log[0],  # noqa: F821
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)
sys.stderr = open(snakemake.log[0], "a")  # noqa: F821, SIM115

output = snakemake.output  # noqa: F821
merge_traces(
    generations=list(snakemake.input.generations),  # noqa: F821
    server=snakemake.input.server,  # noqa: F821
    outputs=TraceOutputs(
        output.traces,
        output.train,
        output.validation,
        output.stats,
        output.conversations,
        output.lengths_plot,
        output.counts_plot,
    ),
    filters=TraceFilters.from_config(snakemake.params.traces),  # noqa: F821
    prompts=list(snakemake.input.prompts),  # noqa: F821
)
