"""Rule build_demo_target: fit the tiny demo target on the sample and render its systemd unit."""

import os

from eagle3_pipeline.demo.target import build_demo_target
from eagle3_pipeline.logs import stage
from eagle3_pipeline.settings import DemoSettings, whole

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

build_demo_target(
    sample_path=snakemake.input.sample,
    unit_template_path=snakemake.input.unit_template,
    target_dir=os.path.dirname(snakemake.output.config),
    unit_path=snakemake.output.unit,
    # the rule's params (family, port, fit_seconds, seed); the rule exists only when demo.enabled
    demo=whole(DemoSettings, {**dict(snakemake.params.items()), "enabled": True}),
    # the checkout holding .venv-vllm, also under `snakemake --directory elsewhere`
    repo=os.path.dirname(snakemake.scriptdir),
)
