"""Rule preflight_replicas: each of server.replicas checked as preflight_generation checks the primary,
all at once (their model loads overlap)."""

from eagle3_pipeline.generate.preflight import preflight_replicas
from eagle3_pipeline.logs import stage

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

preflight_replicas(
    replicas=list(zip(snakemake.params.fleet.replicas, snakemake.output.replicas, strict=True)),
    generation=snakemake.params.runtime.section("generation", snakemake.params.generation),
    selection=snakemake.input.selection,
    summary_path=snakemake.output.summary,
)
