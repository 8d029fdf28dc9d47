"""Rule export_draft: the trained draft as an EAGLE-3 checkpoint that vLLM and SGLang load."""

import logging
import sys

from eagle3_pipeline.draft.export import export_checkpoint

logging.basicConfig(
    filename=snakemake.log[0],  # noqa: F821
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)
logging.captureWarnings(True)
sys.stderr = open(snakemake.log[0], "a")  # noqa: F821, SIM115

export_checkpoint(
    weights=snakemake.input.weights,  # noqa: F821
    vocab_map=snakemake.input.vocab_map,  # noqa: F821
    target_config=snakemake.input.target,  # noqa: F821
    hidden_states_metadata=snakemake.input.hidden_states_metadata,  # noqa: F821
    output_config=snakemake.output.config,  # noqa: F821
    output_weights=snakemake.output.weights,  # noqa: F821
)
