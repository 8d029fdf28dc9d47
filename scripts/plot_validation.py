"""Rule plot_validation: the report's pictures from every stage's outputs."""

import logging
import sys

from eagle3_pipeline.validate.report import draw_report

logging.basicConfig(
    filename=snakemake.log[0],  # noqa: F821
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)
sys.stderr = open(snakemake.log[0], "a")  # noqa: F821, SIM115

draw_report(
    inputs=dict(snakemake.input.items()),  # noqa: F821
    outputs=dict(snakemake.output.items()),  # noqa: F821
)
