"""Rule serve_check: the target served by vLLM with the exported draft; spec-decode counters read."""

import os

from eagle3_pipeline.logs import stage
from eagle3_pipeline.settings import GenerationSettings, ServerSettings, ValidateSettings
from eagle3_pipeline.validate.serve_check import serve_check

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)
runtime = snakemake.params.runtime

serve_check(
    checkpoint_dir=os.path.dirname(snakemake.input.checkpoint),
    validation_path=snakemake.input.validation,
    server_json_path=snakemake.input.server,
    server=runtime.whole(ServerSettings, "server"),
    generation=runtime.whole(GenerationSettings, "generation", snakemake.params.generation),
    validate=runtime.whole(ValidateSettings, "validate", snakemake.params.validate),
    work_dir=snakemake.params.work,
    output_path=snakemake.output[0],
    offline_path=snakemake.input.offline,
)
