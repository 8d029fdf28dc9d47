# Does the served model accept the draft? Offline acceptance on held-out hidden states, and the draft
# actually served by vLLM with its spec-decode counters read from /metrics. Per {variant}: the main
# draft and, with validate.baseline, the baseline (results/{run}/baseline/), on the same validation data.


rule validate_offline:
    input:
        checkpoint=rules.export_draft.output.config,
        states=get_validation_states(),  # the main draft's: both variants on the same held-out data
        target=get_target_config(),
    output:
        f"{RESULTS}/{{variant}}validation/offline.json",
    log:
        f"{LOGS}/{{variant}}validate_offline.log",
    conda:
        "../envs/pipeline.yaml"
    resources:
        gpu=1,  # the draft and the target's lm_head over every validation token; CPU when none
    params:
        ttt_steps=SETTINGS.draft.ttt_steps,
    script:
        "../scripts/validate_offline.py"


# One draft server at a time (the local demo's port, or production's unit behind its drop-in), yet
# without ordering the checks: either may fail alone. Snakemake schedules draft_server like cores;
# its limit is 1 unless the command line sets one (`--resources draft_server=N`).
if "draft_server" not in workflow.global_resources:
    workflow.register_resource("draft_server", 1)


rule serve_check:
    input:
        checkpoint=rules.export_draft.output.config,
        validation=rules.split_traces.output.validation,  # the main traces' validation questions
        server=rules.snapshot_server.output.server,
        offline=rules.validate_offline.output[0],  # served acceptance must match it (validate/served.py)
    output:
        f"{RESULTS}/{{variant}}validation/serve_check.json",
    log:
        f"{LOGS}/{{variant}}serve_check.log",
    # before any extraction job that is ready with it (the baseline's): see get_serve_check_resources
    priority: 1
    conda:
        "../envs/pipeline.yaml"
    resources:
        **get_serve_check_resources(),
    params:
        # the requests' sampling and concurrency (the tokens/s compared) and the check's own keys;
        # which server is an input (server.json), reaching and restarting it is run-time only
        generation=sampling_params(config["generation"])
        | as_params(SETTINGS.generation, "concurrency"),
        validate=as_params(
            SETTINGS.validate,
            "num_speculative_tokens",
            "max_questions",
            "max_tokens",
            "temperature",
            "enforce_eager",
            "served_offline_tolerance",
            "speedup",
        ),
        runtime=runtime_only(
            server=SERVER,
            generation=as_params(SETTINGS.generation, "retries", "request_timeout_s"),
            validate=as_params(SETTINGS.validate, "remote_dir"),
        ),
        work=f"{WORK}/{{variant}}serve_check",  # the vLLM log, pid file and drop-in state of this check
    script:
        "../scripts/serve_check.py"


# What plot_validation draws from: every stage's outputs; the serve checks and the baseline when configured.
REPORT_INPUTS = {
    "unit": rules.snapshot_server.output.unit,
    "server": rules.snapshot_server.output.server,
    "stats": rules.merge_traces.output.stats,
    "traces": rules.merge_traces.output.traces,
    "history": variant_output(rules.train_draft.output.history, ""),
    "offline": variant_output(rules.validate_offline.output[0], ""),
}
if SETTINGS.validate.serve_check:
    REPORT_INPUTS["serve_check"] = variant_output(rules.serve_check.output[0], "")
if SETTINGS.validate.baseline:
    REPORT_INPUTS["baseline_history"] = variant_output(rules.train_draft.output.history)
    REPORT_INPUTS["baseline_offline"] = variant_output(rules.validate_offline.output[0])
    if SETTINGS.validate.serve_check:
        REPORT_INPUTS["baseline_serve_check"] = variant_output(
            rules.serve_check.output[0]
        )


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
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/plot_validation.py"
