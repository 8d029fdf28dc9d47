"""Rule preflight_generation: one short request and the prompts' token counts, before any shard, against
the server (server.replicas: rule preflight_replicas)."""

from eagle3_pipeline.generate.preflight import preflight_generation
from eagle3_pipeline.logs import stage

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

preflight_generation(
    server_json_path=snakemake.params.server_json,
    server_cfg=snakemake.params.runtime.section("server"),
    generation=snakemake.params.runtime.section("generation", snakemake.params.generation),
    selection_path=snakemake.input.selection,
    output_path=snakemake.output[0],
    state_dir=snakemake.params.state_dir,
)
