"""Rule head_to_head: the Kimi-family demo's MLA draft against the Llama draft trained on the same states
(demo/head_to_head.py), into validation/head_to_head.json and its report page (report/head_to_head.html)."""

from eagle3_pipeline.demo.head_to_head import compare
from eagle3_pipeline.logs import stage
from eagle3_pipeline.validate.report_head_to_head import head_to_head_page

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

compare(
    mla_config=snakemake.input.mla_config,
    mla_offline=snakemake.input.mla_offline,
    llama_config=snakemake.input.llama_config,
    llama_offline=snakemake.input.llama_offline,
    k=snakemake.params.num_speculative_tokens,
    output_path=snakemake.output.json,
    mla_served=snakemake.input.get("mla_served"),
    mla_selection=snakemake.input.mla_selection,
    llama_selection=snakemake.input.llama_selection,
)
head_to_head_page(snakemake.output.json, snakemake.output.page)
