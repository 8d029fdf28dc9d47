"""Rule check_replicas: every replica's identity check passed (check_replica); the preflights wait on it."""

from eagle3_pipeline.logs import stage
from eagle3_pipeline.server.replicas import write_checked

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

write_checked(snakemake.params.names, snakemake.output[0])
