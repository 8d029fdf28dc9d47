"""Rule generate_shard: one prompt shard sent to the vLLM server, journaled under work/, then written."""

import logging
import sys

from eagle3_pipeline.generate import generate_shard

logging.basicConfig(
    filename=snakemake.log[0],  # noqa: F821
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)
sys.stderr = open(snakemake.log[0], "a")  # noqa: F821, SIM115

generate_shard(
    prompts_path=snakemake.input.prompts,  # noqa: F821
    output_path=snakemake.output[0],  # noqa: F821
    server_json_path=snakemake.params.server_json,  # noqa: F821
    server_cfg=snakemake.params.server,  # noqa: F821
    generation=snakemake.params.generation,  # noqa: F821
    journal_path=snakemake.params.journal,  # noqa: F821
    state_dir=snakemake.params.state_dir,  # noqa: F821
    shard=int(snakemake.wildcards.shard),  # noqa: F821
)
