# Does the served model accept the draft? Offline acceptance on held-out hidden states, and the draft
# actually served by vLLM with its spec-decode counters read from /metrics.


rule validate_offline:
    input:
        checkpoint=rules.export_draft.output.config,
        states=get_validation_states(),
        target=get_target_config(),
    output:
        f"{RESULTS}/validation/offline.json",
    log:
        f"{LOGS}/validate_offline.log",
    resources:
        gpu=1,  # the draft and the target's lm_head over every validation token; CPU when none
    params:
        ttt_steps=config["draft"]["ttt_steps"],
    script:
        "../scripts/validate_offline.py"


rule serve_check:
    input:
        checkpoint=rules.export_draft.output.config,
        validation=rules.split_traces.output.validation,
        server=rules.snapshot_server.output.server,
        offline=rules.validate_offline.output[0],  # served acceptance must match it (validate/served.py)
    output:
        f"{RESULTS}/validation/serve_check.json",
    log:
        f"{LOGS}/serve_check.log",
    params:
        server=SERVER,
        generation=config["generation"],
        validate=config["validate"],
        work=f"{WORK}/serve_check",
    script:
        "../scripts/serve_check.py"


if config["validate"]["baseline"]:

    include: "baseline.smk"


# What plot_validation draws from: every stage's outputs; the serve checks and the baseline when configured.
REPORT_INPUTS = {
    "unit": rules.snapshot_server.output.unit,
    "server": rules.snapshot_server.output.server,
    "stats": rules.merge_traces.output.stats,
    "traces": rules.merge_traces.output.traces,
    "history": rules.train_draft.output.history,
    "offline": rules.validate_offline.output[0],
}
if config["validate"]["serve_check"]:
    REPORT_INPUTS["serve_check"] = rules.serve_check.output[0]
if config["validate"]["baseline"]:
    REPORT_INPUTS["baseline_history"] = rules.baseline_train_draft.output.history
    REPORT_INPUTS["baseline_offline"] = rules.baseline_validate_offline.output[0]
    if config["validate"]["serve_check"]:
        REPORT_INPUTS["baseline_serve_check"] = rules.baseline_serve_check.output[0]


rule plot_validation:
    input:
        **REPORT_INPUTS,
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
