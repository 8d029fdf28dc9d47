"""Rule validate_offline_init (draft.init_from set): the starting draft through the same offline check as
the trained one, on the same validation states, beside it in the report."""

import os

from eagle3_pipeline.logs import stage
from eagle3_pipeline.settings import DraftSettings, whole
from eagle3_pipeline.validate.offline import validate_starting_draft

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

validate_starting_draft(
    init_from=os.path.dirname(snakemake.input.init_from[0]),  # the folder of its config.json
    target_dir=os.path.dirname(snakemake.input.target),
    draft=whole(DraftSettings, snakemake.params.draft),
    shard_paths=snakemake.input.states,
    work=snakemake.params.work,
    output_path=snakemake.output[0],
    steps=snakemake.params.ttt_steps,
    context_buckets=snakemake.params.context_buckets,
    num_speculative_tokens=snakemake.params.num_speculative_tokens,
    served_max_tokens=snakemake.params.served_max_tokens,
)
