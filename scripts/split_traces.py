"""Rule split_traces: traces.parquet -> train.parquet and validation.parquet, by its split column."""

from eagle3_pipeline.logs import stage
from eagle3_pipeline.traces import split_traces

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

split_traces(
    traces=snakemake.input[0],
    train=snakemake.output.train,
    validation=snakemake.output.validation,
)
