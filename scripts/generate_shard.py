"""Rule generate_shard: one prompt shard sent to its vLLM server (server k mod n with server.replicas),
journaled under work/, then written."""

from eagle3_pipeline.generate import generate_shard
from eagle3_pipeline.logs import stage
from eagle3_pipeline.settings import GenerationSettings, ServerSettings

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

params = snakemake.params
shard = int(snakemake.wildcards.shard)
generate_shard(
    prompts_path=snakemake.input.prompts,
    output_path=snakemake.output[0],
    server_json_path=params.server_json,
    server=params.runtime.whole(ServerSettings, "server"),
    generation=params.runtime.whole(GenerationSettings, "generation", params.generation),
    journal_path=params.journal,
    state_dir=params.state_dir,
    shard=shard,
    replica=params.fleet.for_shard(shard),
)
