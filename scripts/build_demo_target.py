"""Rule build_demo_target: fit the tiny demo target on the sample and render its systemd unit."""

import logging
import sys

from eagle3_pipeline.demo.fit import FitSettings
from eagle3_pipeline.demo.target import build_demo_target

logging.basicConfig(
    filename=snakemake.log[0],  # noqa: F821
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)
logging.captureWarnings(True)
sys.stderr = open(snakemake.log[0], "a")  # noqa: F821, SIM115

build_demo_target(
    sample_path=snakemake.input.sample,  # noqa: F821
    unit_template_path=snakemake.input.unit_template,  # noqa: F821
    target_dir=snakemake.params.target_dir,  # noqa: F821
    unit_path=snakemake.output.unit,  # noqa: F821
    port=snakemake.params.port,  # noqa: F821
    settings=FitSettings(seconds=snakemake.params.fit_seconds, seed=snakemake.params.seed),  # noqa: F821
)
