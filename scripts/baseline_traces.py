"""Rule baseline_traces: the training questions answered with the dataset's original answers."""

import logging
import sys

from eagle3_pipeline.validate.baseline import write_baseline_traces

logging.basicConfig(
    filename=snakemake.log[0],  # noqa: F821
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)
sys.stderr = open(snakemake.log[0], "a")  # noqa: F821, SIM115

write_baseline_traces(train_path=snakemake.input[0], output_path=snakemake.output[0])  # noqa: F821
