"""Rule head_to_head: the Kimi-family demo's MLA draft against the Llama draft trained on the same states
(demo/head_to_head.py), into validation/head_to_head.json."""

from eagle3_pipeline.demo.head_to_head import compare
from eagle3_pipeline.logs import stage

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

compare(
    mla_config=snakemake.input.mla_config,
    mla_offline=snakemake.input.mla_offline,
    llama_config=snakemake.input.llama_config,
    llama_offline=snakemake.input.llama_offline,
    k=snakemake.params.num_speculative_tokens,
    output_path=snakemake.output[0],
    mla_served=snakemake.input.get("mla_served"),
)
