"""Rule prepare_prompts: block b of the dataset's questions, with stable ids, in selection order."""

from eagle3_pipeline.logs import stage
from eagle3_pipeline.prompts import prepare_prompts

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

prepare_prompts(
    selection=snakemake.params.selection,
    num_samples=snakemake.params.rows["stop"],
    start=snakemake.params.rows["start"],
    selection_path=snakemake.output.selection,
    skipped_path=snakemake.output.skipped,
)
