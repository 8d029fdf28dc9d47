# Does the served model accept the draft? Offline acceptance on held-out hidden states, and the draft
# actually served by vLLM with its spec-decode counters read from /metrics.


rule validate_offline:
    input:
        checkpoint=rules.export_draft.output.config,
        states=expand(
            f"{RESULTS}/hidden_states/validation/shard-{{shard}}.safetensors",
            shard=SHARDS,
        ),
        target=get_target_config(),
    output:
        f"{RESULTS}/validation/offline.json",
    log:
        f"{LOGS}/validate_offline.log",
    resources:
        gpu=1,  # the draft and the target's lm_head over every validation token; CPU when none
    params:
        checkpoint_dir=f"{RESULTS}/draft/checkpoint",
        target=config["target"]["model"],
        ttt_steps=config["draft"]["ttt_steps"],
    script:
        "../scripts/validate_offline.py"


rule serve_check:
    input:
        checkpoint=rules.export_draft.output.config,
        validation=rules.merge_traces.output.validation,
        server=rules.snapshot_server.output.server,
    output:
        f"{RESULTS}/validation/serve_check.json",
    log:
        f"{LOGS}/serve_check.log",
    params:
        checkpoint_dir=f"{RESULTS}/draft/checkpoint",
        server=config["server"],
        generation=config["generation"],
        validate=config["validate"],
        work=f"{WORK}/serve_check",
    script:
        "../scripts/serve_check.py"


if config["validate"]["baseline"]:

    include: "baseline.smk"


def get_report_inputs(wildcards):
    """What plot_validation draws from: every stage's outputs; serve check and baseline when configured."""
    inputs = {
        "unit": rules.snapshot_server.output.unit,
        "server": rules.snapshot_server.output.server,
        "stats": rules.merge_traces.output.stats,
        "traces": rules.merge_traces.output.traces,
        "history": rules.train_draft.output.history,
        "offline": rules.validate_offline.output[0],
    }
    if config["validate"]["serve_check"]:
        inputs["serve_check"] = rules.serve_check.output[0]
    if config["validate"]["baseline"]:
        inputs["baseline_history"] = f"{RESULTS}/baseline/draft/trained/history.json"
        inputs["baseline_offline"] = f"{RESULTS}/baseline/validation/offline.json"
        if config["validate"]["serve_check"]:
            inputs["baseline_serve_check"] = (
                f"{RESULTS}/baseline/validation/serve_check.json"
            )
    return inputs


rule plot_validation:
    input:
        unpack(get_report_inputs),
    output:
        server=report(
            f"{RESULTS}/report/server.html",
            caption="../report/server.rst",
            category="1. Server",
        ),
        trace_stats=report(
            f"{RESULTS}/report/trace_stats.html",
            caption="../report/trace_stats.rst",
            category="2. Traces",
        ),
        trace_lengths=report(
            f"{RESULTS}/report/trace_lengths.png",
            caption="../report/trace_lengths.rst",
            category="2. Traces",
        ),
        training=report(
            f"{RESULTS}/report/training.png",
            caption="../report/training.rst",
            category="3. Training",
        ),
        acceptance=report(
            f"{RESULTS}/report/acceptance.png",
            caption="../report/acceptance.rst",
            category="4. Validation",
        ),
        comparison=report(
            f"{RESULTS}/report/comparison.png",
            caption="../report/comparison.rst",
            category="4. Validation",
        ),
    log:
        f"{LOGS}/plot_validation.log",
    script:
        "../scripts/plot_validation.py"
