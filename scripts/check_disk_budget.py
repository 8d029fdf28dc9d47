"""Rule check_disk_budget: shard k's hidden states' disk need, from its traces, against free space and cap."""

from eagle3_pipeline.budget import check_disk_budget
from eagle3_pipeline.logs import stage

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

check_disk_budget(
    traces=[snakemake.input.train, snakemake.input.validation],
    target_config=snakemake.input.target,
    hidden_states_dir=snakemake.params.hidden_states,
    output=snakemake.output[0],
    max_seq_len=snakemake.params.max_seq_len,
    overlong=snakemake.params.overlong,
    dtype=snakemake.params.dtype,
    max_disk_gb=snakemake.params.max_disk_gb,
)
