"""Rule validate_offline: the exported draft run greedily over the validation hidden states, by slice, and
the serve check's run replayed along the validation traces."""

import os

from eagle3_pipeline.logs import stage
from eagle3_pipeline.validate.offline import validate_offline

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

validate_offline(
    checkpoint_dir=os.path.dirname(snakemake.input.checkpoint),
    target_dir=os.path.dirname(snakemake.input.target),
    shard_paths=snakemake.input.states,
    steps=snakemake.params.ttt_steps,
    output_path=snakemake.output[0],
    context_buckets=snakemake.params.context_buckets,
    num_speculative_tokens=snakemake.params.num_speculative_tokens,
    served_max_tokens=snakemake.params.served_max_tokens,
)
