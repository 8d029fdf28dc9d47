"""Rule write_prompt_shard: shard k of the selected questions, cut out of prompts/selection.parquet."""

from eagle3_pipeline.logs import setup_script_logging
from eagle3_pipeline.prompts import write_prompt_shard

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
setup_script_logging(snakemake.log[0], "write_prompt_shard")

write_prompt_shard(
    selection_path=snakemake.input.selection,
    start=snakemake.params.rows["start"],
    stop=snakemake.params.rows["stop"],
    output=snakemake.output[0],
)
