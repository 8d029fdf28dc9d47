"""Rule plot_validation: the report's pictures from every stage's outputs."""

from pathlib import Path

from eagle3_pipeline.logs import stage
from eagle3_pipeline.validate.report import draw_report
from eagle3_pipeline.validate.report_curves import draw_curves
from eagle3_pipeline.validate.report_engine import engine_page
from eagle3_pipeline.validate.report_front import write_front_page

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

inputs, outputs = dict(snakemake.input.items()), dict(snakemake.output.items())
draw_report(inputs=inputs, outputs=outputs)
draw_curves(inputs=inputs, outputs=outputs)  # selection and learning curve, when configured
run_dir = Path(outputs["engine"]).parent.parent  # results/RUN: the engine starts' scopes are named from it
engine_page(snakemake.params.engine_stats, outputs["engine"], run_dir)
write_front_page(inputs=inputs, outputs=outputs)  # the report's first page: the verdict
