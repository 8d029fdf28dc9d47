# The experiment's baseline (validate.baseline): the same draft training on the dataset's original
# answers instead of the target's own traces, under results/{run}/baseline/. Every step reuses the main
# path's rule (`use rule ... with:`); validation runs on the target's own validation outputs, as for
# the main draft. The baseline's serve check waits for the main one (one draft server at a time).
BASELINE = f"{RESULTS}/baseline"


rule baseline_traces:
    input:
        rules.filter_traces.output.train,
    output:
        f"{BASELINE}/traces/shards/train/shard-{{shard}}.parquet",
    log:
        f"{LOGS}/baseline/baseline_traces/{{shard}}.log",
    script:
        "../scripts/baseline_traces.py"


use rule extract_hidden_states as baseline_extract_hidden_states with:
    input:
        traces=[rules.baseline_traces.output[0]],  # the baseline trains only: no validation split
        target=get_target_config(),
        server_stopped=ancient(rules.stop_server.output[0]),
    output:
        states=[f"{BASELINE}/hidden_states/train/shard-{{shard}}.safetensors"],
        metadata=[f"{BASELINE}/hidden_states/train/shard-{{shard}}.json"],
    log:
        f"{LOGS}/baseline/extract_hidden_states/{{shard}}.log",
    params:
        work=f"{WORK}/baseline/hidden_states/{{shard}}",


use rule vocab_map as baseline_vocab_map with:
    input:
        metadata=shard_files(f"{BASELINE}/hidden_states/train/shard-{{shard}}.json"),
        target=get_target_config(),
    output:
        f"{BASELINE}/draft/vocab_map.safetensors",
    log:
        f"{LOGS}/baseline/vocab_map.log",


use rule train_draft as baseline_train_draft with:
    input:
        states=shard_files(
            f"{BASELINE}/hidden_states/train/shard-{{shard}}.safetensors",
            f"{RESULTS}/hidden_states/validation/shard-{{shard}}.safetensors",
        ),
        vocab_map=rules.baseline_vocab_map.output,
        target=get_target_config(),
        corpus=rules.merge_traces.output.stats,
    output:
        weights=f"{BASELINE}/draft/trained/model.safetensors",
        history=f"{BASELINE}/draft/trained/history.json",
    log:
        f"{LOGS}/baseline/train_draft.log",
    params:
        work=f"{WORK}/baseline/train",


use rule export_draft as baseline_export_draft with:
    input:
        weights=rules.baseline_train_draft.output.weights,
        vocab_map=rules.baseline_vocab_map.output,
        target=get_target_config(),
        hidden_states_metadata=f"{BASELINE}/hidden_states/train/shard-{SHARDS[0]}.json",
    output:
        config=f"{BASELINE}/draft/checkpoint/config.json",
        weights=f"{BASELINE}/draft/checkpoint/model.safetensors",
    log:
        f"{LOGS}/baseline/export_draft.log",


use rule validate_offline as baseline_validate_offline with:
    input:
        checkpoint=rules.baseline_export_draft.output.config,
        states=shard_files(
            f"{RESULTS}/hidden_states/validation/shard-{{shard}}.safetensors"
        ),
        target=get_target_config(),
    output:
        f"{BASELINE}/validation/offline.json",
    log:
        f"{LOGS}/baseline/validate_offline.log",


use rule serve_check as baseline_serve_check with:
    input:
        checkpoint=rules.baseline_export_draft.output.config,
        validation=rules.split_traces.output.validation,
        server=rules.snapshot_server.output.server,
        offline=rules.baseline_validate_offline.output[0],
        after=rules.serve_check.output,
    output:
        f"{BASELINE}/validation/serve_check.json",
    log:
        f"{LOGS}/baseline/serve_check.log",
        work=f"{WORK}/baseline/serve_check",
