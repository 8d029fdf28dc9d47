"""Rule write_prompt_shard: shard k of the selected questions, cut out of prompts/selection.parquet."""

from eagle3_pipeline.logs import stage
from eagle3_pipeline.prompts import write_prompt_shard

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

write_prompt_shard(
    selection_path=snakemake.input.selection,
    start=snakemake.params.rows["start"],
    stop=snakemake.params.rows["stop"],
    output=snakemake.output[0],
)
