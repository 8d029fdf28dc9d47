# The embedded demo's tiny target (Llama, 8 layers, head_dim 64, its own byte-level BPE tokenizer and a
# Kimi-style thinking template), fitted on the bundled sample, and the systemd unit that serves it.
from pathlib import Path

from eagle3_pipeline.config import ConfigError

DEMO_SAMPLE = "config/demo/sample.jsonl"  # what the demo target is fitted on, and the demo's dataset

# results/demo is the demo's: a run on other data beside it needs a name of its own, or the finished demo
# would be overwritten with another dataset's figures
if (
    SETTINGS.run == "demo"
    and Path(str(SETTINGS.dataset.path)).resolve() != Path(DEMO_SAMPLE).resolve()
):
    raise ConfigError(
        f"run is 'demo' but dataset.path is {SETTINGS.dataset.path}, not the demo's sample: set run to a "
        "name of your own (results/{run}/), so that results/demo stays the demo's"
    )


if SETTINGS.demo.enabled:

    rule build_demo_target:
        input:
            # the bundled sample, whatever dataset.path is: a run on your own data (its own `run`)
            # keeps the demo's target and leaves results/demo as it was
            sample=DEMO_SAMPLE,
            unit_template="config/demo/vllm-demo.service.in",
        output:
            config="resources/demo/target/config.json",
            weights="resources/demo/target/model.safetensors",
            tokenizer="resources/demo/target/tokenizer.json",
            unit="resources/demo/vllm-demo.service",
        log:
            f"{LOGS}/build_demo_target.log",
        conda:
            "../envs/pipeline.yaml"
        threads: 2
        params:
            port=SETTINGS.demo.port,
            fit_seconds=SETTINGS.demo.fit_seconds,
            seed=SETTINGS.demo.seed,
        script:
            "../scripts/build_demo_target.py"
