"""Rule baseline_traces: the training questions answered with the dataset's original answers."""

from eagle3_pipeline.logs import setup_script_logging
from eagle3_pipeline.validate.baseline import write_baseline_traces

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
setup_script_logging(snakemake.log[0], "baseline_traces")

write_baseline_traces(train_path=snakemake.input[0], output_path=snakemake.output[0])
