"""Rule validate_offline: the exported draft run greedily over the validation hidden states."""

import os

from eagle3_pipeline.logs import setup_script_logging
from eagle3_pipeline.validate.offline import validate_offline

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
setup_script_logging(snakemake.log[0], "validate_offline")

validate_offline(
    checkpoint_dir=os.path.dirname(snakemake.input.checkpoint),
    target_dir=os.path.dirname(snakemake.input.target),
    shard_paths=snakemake.input.states,
    steps=snakemake.params.ttt_steps,
    output_path=snakemake.output[0],
)
