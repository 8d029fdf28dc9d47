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
