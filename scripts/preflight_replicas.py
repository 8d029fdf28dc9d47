"""Rule preflight_replicas: each of server.replicas checked as preflight_generation checks the primary,
all at once (their model loads overlap)."""

from eagle3_pipeline.generate.preflight import preflight_replicas
from eagle3_pipeline.logs import stage
from eagle3_pipeline.settings import GenerationSettings

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

params = snakemake.params
preflight_replicas(
    replicas=list(zip(params.fleet.replicas, snakemake.output.replicas, strict=True)),
    generation=params.runtime.whole(GenerationSettings, "generation", params.generation),
    selection_path=snakemake.input.selection,
    summary_path=snakemake.output.summary,
)
