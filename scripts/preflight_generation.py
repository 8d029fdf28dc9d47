"""Rule preflight_generation: one short request and the prompts' token counts, before any shard, against
the server (server.replicas: rule preflight_replicas)."""

from eagle3_pipeline.generate.preflight import preflight_generation
from eagle3_pipeline.logs import stage
from eagle3_pipeline.settings import GenerationSettings, ServerSettings

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

params = snakemake.params
preflight_generation(
    server_json_path=params.server_json,
    server=params.runtime.whole(ServerSettings, "server"),
    generation=params.runtime.whole(GenerationSettings, "generation", params.generation),
    selection_path=snakemake.input.selection,
    output_path=snakemake.output[0],
    state_dir=params.state_dir,
)
