"""Rule baseline_traces: the training questions answered with the dataset's original answers."""

from eagle3_pipeline.logs import stage
from eagle3_pipeline.validate.baseline import write_baseline_traces

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

write_baseline_traces(train_path=snakemake.input[0], output_path=snakemake.output[0])
