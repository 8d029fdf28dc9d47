"""Rule split_traces: traces.parquet -> train.parquet and validation.parquet, by its split column."""

from eagle3_pipeline.logs import setup_script_logging
from eagle3_pipeline.traces import split_traces

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
setup_script_logging(snakemake.log[0], "split_traces")

split_traces(
    traces=snakemake.input[0],
    train=snakemake.output.train,
    validation=snakemake.output.validation,
)
