"""Rule plot_validation: the report's pictures from every stage's outputs."""

from eagle3_pipeline.logs import stage
from eagle3_pipeline.validate.report import draw_report
from eagle3_pipeline.validate.report_curves import draw_curves

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

inputs, outputs = dict(snakemake.input.items()), dict(snakemake.output.items())
draw_report(inputs=inputs, outputs=outputs)
draw_curves(inputs=inputs, outputs=outputs)  # selection and learning curve, when configured
