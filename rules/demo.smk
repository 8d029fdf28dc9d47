# The embedded demo's tiny target (Llama, 8 layers, head_dim 64, its own byte-level BPE tokenizer and a
# Kimi-style thinking template), fitted on the bundled sample, and the systemd unit that serves it.
if SETTINGS.demo.enabled:

    rule build_demo_target:
        input:
            # the bundled sample, whatever dataset.path is: a run on your own data (its own `run`)
            # keeps the demo's target and leaves results/demo as it was
            sample="config/demo/sample.jsonl",
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
