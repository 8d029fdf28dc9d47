"""Rule serve_check: the target served by vLLM with the exported draft; spec-decode counters read."""

import logging
import os
import sys

from eagle3_pipeline.validate.serve_check import serve_check

logging.basicConfig(
    filename=snakemake.log[0],  # noqa: F821
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)
sys.stderr = open(snakemake.log[0], "a")  # noqa: F821, SIM115

serve_check(
    checkpoint_dir=os.path.dirname(snakemake.input.checkpoint),  # noqa: F821
    validation_path=snakemake.input.validation,  # noqa: F821
    server_json_path=snakemake.input.server,  # noqa: F821
    server_cfg=snakemake.params.server,  # noqa: F821
    generation=snakemake.params.generation,  # noqa: F821
    validate=snakemake.params.validate,  # noqa: F821
    work_dir=snakemake.params.work,  # noqa: F821
    output_path=snakemake.output[0],  # noqa: F821
)
