"""Rule vocab_map: d2t / t2d from the loss-masked token counts of the training hidden states."""

import logging
import sys

from eagle3_pipeline.draft.config import read_target_config
from eagle3_pipeline.draft.vocab import build_vocab_map

logging.basicConfig(
    filename=snakemake.log[0],  # noqa: F821
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)
logging.captureWarnings(True)
sys.stderr = open(snakemake.log[0], "a")  # noqa: F821, SIM115

build_vocab_map(
    metadata_paths=snakemake.input.metadata,  # noqa: F821
    target_vocab_size=int(read_target_config(snakemake.input.target)["vocab_size"]),  # noqa: F821
    draft_vocab_size=snakemake.params.draft_vocab_size,  # noqa: F821
    output=snakemake.output[0],  # noqa: F821
)
