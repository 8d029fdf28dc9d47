"""Rule plot_validation: the report's pictures from every stage's outputs."""

from eagle3_pipeline.logs import stage
from eagle3_pipeline.validate.report import draw_report

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

draw_report(
    inputs=dict(snakemake.input.items()),
    outputs=dict(snakemake.output.items()),
)
