"""Rule validate_offline: the exported draft run greedily over the validation hidden states."""

import logging
import os
import sys

from eagle3_pipeline.validate.offline import validate_offline

logging.basicConfig(
    filename=snakemake.log[0],  # noqa: F821
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)
sys.stderr = open(snakemake.log[0], "a")  # noqa: F821, SIM115

validate_offline(
    checkpoint_dir=os.path.dirname(snakemake.input.checkpoint),  # noqa: F821
    target_dir=os.path.dirname(snakemake.input.target),  # noqa: F821
    shard_paths=snakemake.input.states,  # noqa: F821
    steps=snakemake.params.ttt_steps,  # noqa: F821
    output_path=snakemake.output[0],  # noqa: F821
)
