"""Rule generate_shard: one prompt shard sent to its vLLM server (server k mod n with server.replicas),
journaled under work/, then written."""

from eagle3_pipeline.generate import generate_shard
from eagle3_pipeline.logs import stage

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

shard = int(snakemake.wildcards.shard)
generate_shard(
    prompts_path=snakemake.input.prompts,
    output_path=snakemake.output[0],
    server_json_path=snakemake.params.server_json,
    server_cfg=snakemake.params.runtime.section("server"),
    generation=snakemake.params.runtime.section("generation", snakemake.params.generation),
    journal_path=snakemake.params.journal,
    state_dir=snakemake.params.state_dir,
    shard=shard,
    replica=snakemake.params.fleet.for_shard(shard),
)
