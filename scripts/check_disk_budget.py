"""Rule check_disk_budget: the hidden states' disk need, from the traces, checked against free space."""

import logging
import sys

from eagle3_pipeline.budget import check_disk_budget

logging.basicConfig(
    filename=snakemake.log[0],  # noqa: F821
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)
sys.stderr = open(snakemake.log[0], "a")  # noqa: F821, SIM115

check_disk_budget(
    traces=[snakemake.input.train, snakemake.input.validation],  # noqa: F821
    target_config=snakemake.input.target,  # noqa: F821
    hidden_states_dir=snakemake.params.hidden_states,  # noqa: F821
    output=snakemake.output[0],  # noqa: F821
    max_seq_len=snakemake.params.max_seq_len,  # noqa: F821
    overlong=snakemake.params.overlong,  # noqa: F821
    dtype=snakemake.params.dtype,  # noqa: F821
)
