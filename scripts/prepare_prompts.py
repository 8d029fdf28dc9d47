"""Rule prepare_prompts: the dataset's questions, with stable ids, in fixed-membership shards."""

import logging
import sys

from eagle3_pipeline.prompts import prepare_prompts

logging.basicConfig(
    filename=snakemake.log[0],  # noqa: F821
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)
sys.stderr = open(snakemake.log[0], "a")  # noqa: F821, SIM115

prepare_prompts(
    dataset=snakemake.params.dataset,  # noqa: F821
    shard_paths=list(snakemake.output.shards),  # noqa: F821
    skipped_path=snakemake.output.skipped,  # noqa: F821
)
