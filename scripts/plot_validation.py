"""Rule plot_validation: the report's pictures from every stage's outputs."""

from eagle3_pipeline.logs import setup_script_logging
from eagle3_pipeline.validate.report import draw_report

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
setup_script_logging(snakemake.log[0], "plot_validation")

draw_report(
    inputs=dict(snakemake.input.items()),
    outputs=dict(snakemake.output.items()),
)
