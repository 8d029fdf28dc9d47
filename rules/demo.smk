# The embedded demo's tiny target, fitted on the bundled sample, and the systemd unit that serves it:
# demo.family llama (resources/demo/: a Llama, 8 layers, head_dim 64, its own byte-level BPE tokenizer
# and a Kimi-style thinking template) or kimi (resources/demo-kimi/: Kimi-K2.5's family in miniature,
# demo/kimi.py, the same tokenizer, template and fit).
from pathlib import Path

from eagle3_pipeline.config import ConfigError
from eagle3_pipeline.demo import DEMO_DIRS, DEMO_UNITS, UNIT_TEMPLATES
from eagle3_pipeline.settings import rerun_params

DEMO_SAMPLE = "config/demo/sample.jsonl"  # what the demo target is fitted on, and the demo's dataset
# the two demos' results folders (config/config.yaml, config/demo-kimi/config.yaml)
DEMO_RUNS = ("demo", "demo-kimi")

# results/demo and results/demo-kimi are the demos': a run on other data beside them needs a name of its
# own, or a finished demo would be overwritten with another dataset's figures
if (
    SETTINGS.run in DEMO_RUNS
    and Path(str(SETTINGS.dataset.path)).resolve() != Path(DEMO_SAMPLE).resolve()
):
    raise ConfigError(
        f"run is '{SETTINGS.run}' but dataset.path is {SETTINGS.dataset.path}, not the demo's sample: set "
        f"run to a name of your own (results/{{run}}/), so that results/{SETTINGS.run} stays the demo's"
    )


if SETTINGS.demo.enabled:
    DEMO_DIR = DEMO_DIRS[SETTINGS.demo.family]

    rule build_demo_target:
        input:
            # the bundled sample, whatever dataset.path is: a run on your own data (its own `run`)
            # keeps the demo's target and leaves results/demo as it was
            sample=DEMO_SAMPLE,
            unit_template=UNIT_TEMPLATES[SETTINGS.demo.family],
        output:
            config=f"{DEMO_DIR}/target/config.json",
            weights=f"{DEMO_DIR}/target/model.safetensors",
            tokenizer=f"{DEMO_DIR}/target/tokenizer.json",
            unit=f"{DEMO_DIR}/{DEMO_UNITS[SETTINGS.demo.family]}",
        log:
            f"{LOGS}/build_demo_target.log",
        conda:
            "../envs/pipeline.yaml"
        threads: 2
        params:
            # port, fit_seconds, seed; demo.family only when not the Llama: the Llama demo's target is
            # not rebuilt for its arrival
            **rerun_params(SETTINGS.demo, "build_demo_target"),
        script:
            "../scripts/build_demo_target.py"
