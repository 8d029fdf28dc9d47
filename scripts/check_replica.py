"""Rule check_replica: a replica's snapshot against the primary's; the run stops naming what differs."""

from eagle3_pipeline.logs import stage
from eagle3_pipeline.server.replicas import check_replica_files

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

check_replica_files(
    snakemake.wildcards.replica,
    primary_identity=snakemake.input.primary_identity,
    primary_server=snakemake.input.primary_server,
    replica_identity=snakemake.input.identity,
    replica_server=snakemake.input.server,
    output=snakemake.output[0],
)
