# The target run over each full conversation (prompt + thinking + answer, the server's own token ids);
# three auxiliary layers and the final one stored packed in bf16, one file per shard and split.
# One job per shard writes every split's file: the target is loaded once, not once per split. Shard k
# reads shard k's traces only: adding shards extracts the new ones and reruns no done one.
# hidden_states.backend: vllm (the serving engine, its settings from the snapshot) or transformers.

# hidden_states.* the states depend on: each a param of its own (a rerun trigger); the script reads
# them back into HiddenStatesSettings with the run-time values (engine_runtime in common.smk)
EXTRACTION_PARAMS = as_params(
    SETTINGS.hidden_states,
    "backend",
    "layers",
    "max_seq_len",
    "overlong",
    "dtype",
    "batch_tokens",
    "compute_dtype",
    "trust_remote_code",
)


rule extract_hidden_states:
    input:
        traces=expand(
            f"{RESULTS}/traces/shards/{{split}}/shard-{{{{shard}}}}.parquet",
            split=SPLITS,
        ),
        target=get_target_config(),
        budget=rules.check_disk_budget.output,
        # ancient: wait for the server to stop (its GPUs), but never rerun a done shard when it stops
        # again after new shards were generated (the stop report is not temp, so it exists)
        server_stopped=ancient(rules.stop_server.output[0]),
        after=get_extraction_gate,  # under a cap: the previous window trained on and deleted
    output:
        # one per split, in the order of input.traces; under a cap deleted once trained on
        states=(temp if WINDOW else list)(
            [f"{STATES}/{split}/shard-{{shard}}.safetensors" for split in SPLITS]
        ),
        metadata=[f"{STATES}/{split}/shard-{{shard}}.json" for split in SPLITS],
    log:
        f"{LOGS}/extract_hidden_states/{EPOCH_DIR}{{shard}}.log",
    conda:
        "../envs/pipeline.yaml"
    resources:
        # transformers: the job runs the target (a 1T MoE needs all 8: set-resources in the profile).
        # vllm: the job is a client of the extraction engine, which holds the GPUs from its start to
        # stop_extraction_engine (training waits on it); the clients share it up to max_clients.
        gpu=0 if VLLM_ENGINE else 1,
        extraction_clients=1 if VLLM_ENGINE else 0,
    params:
        **EXTRACTION_PARAMS,
        # only a rerun trigger (the target's placement under transformers), its value as it always
        # was: the job's launch mode comes from hidden_states.backend and device_map (job.launch_mode)
        launch_mode=(
            "device_map" if SETTINGS.hidden_states.device_map or VLLM_ENGINE else "ddp"
        ),
        vllm=ENGINE_PARAMS,
        runtime=get_engine_runtime,  # device_map, the engine's folder and pacing: no rerun trigger
        # the snapshot exists: the traces come from generation, which needs it
        server_json=rules.snapshot_server.output.server,
        work=f"{WORK}/hidden_states/{EPOCH_DIR}{{shard}}",  # a folder per split inside
    script:
        # a job file under work/ run by `accelerate launch` (eagle3_pipeline.launch): processes clamped
        # to the GPUs the job sees (CPU when none); device_map mode starts one process that spreads
        # the target over all of them; the vllm backend one plain client of its engine
        "../scripts/extract_hidden_states.py"


# The baseline's states (validate.baseline): the same extraction on its own traces, train split only
# (it validates on the main draft's validation states). A rule's outputs are fixed in number, so this
# is extract_hidden_states with other traces and outputs rather than a {variant} of it; it needs no
# disk check of its own (validate.baseline is refused under hidden_states.max_disk_gb). vllm: an engine
# of its own, started once the main draft's GPU jobs are done and stopped by
# baseline_stop_extraction_engine, so that nothing of the main draft depends on the baseline.
use rule extract_hidden_states as baseline_extract_hidden_states with:
    input:
        traces=[rules.baseline_traces.output[0]],
        target=get_target_config(),
        server_stopped=ancient(rules.stop_server.output[0]),
        after=get_baseline_extraction_gate,
    output:
        states=[f"{RESULTS}/{BASELINE}hidden_states/train/shard-{{shard}}.safetensors"],
        metadata=[f"{RESULTS}/{BASELINE}hidden_states/train/shard-{{shard}}.json"],
    log:
        f"{LOGS}/{BASELINE}extract_hidden_states/{{shard}}.log",
    params:
        runtime=get_baseline_engine_runtime,
        work=f"{WORK}/{BASELINE}hidden_states/{{shard}}",


if VLLM_ENGINE:

    localrules:
        # where the engine runs (inside a SLURM job each client owns its own)
        stop_extraction_engine,
        baseline_stop_extraction_engine,

    # The extraction engine's end: after every extraction job it serves (the main shards; under a cap,
    # one epoch's window), before the GPU training rules (get_engine_stopped). Its report is temp (its
    # lines stay in the log) and an ancient input of training: an order, not data. New shards plan it
    # again, after their extraction.
    rule stop_extraction_engine:
        input:
            get_engine_clients,
        output:
            temp(f"{ENGINE_DIR}/stopped.json"),
        log:
            f"{LOGS}/stop_extraction_engine/{ENGINE_SCOPE}.log",
        conda:
            "../envs/pipeline.yaml"
        script:
            "../scripts/stop_extraction_engine.py"

    # The baseline's engine, after every baseline extraction job, before the baseline's training
    use rule stop_extraction_engine as baseline_stop_extraction_engine with:
        input:
            get_baseline_engine_clients,
        output:
            temp(f"{BASELINE_ENGINE_DIR}/stopped.json"),
        log:
            f"{LOGS}/stop_extraction_engine/{BASELINE}hidden_states/engine.log",


# Where the target's weights are not on this machine (TARGET_ABSENT, rules/common/inputs.smk), the jobs
# that read them wait on this job instead of target.model's config.json: a dry run plans every job, and
# a real run stops here at once, naming the folder (no job has the weights to read).
if TARGET_ABSENT:
    from snakemake.exceptions import WorkflowError

    localrules:
        require_target_weights,

    rule require_target_weights:
        output:
            get_target_config(),
        log:
            f"{LOGS}/require_target_weights.log",
        message:
            f"the target's weights are not on this machine ({TARGET_CONFIG}: target.model): a real "
            "run stops here; the plan is made from the config alone"
        run:
            Path(log[0]).write_text(target_absent_message() + "\n")
            raise WorkflowError(target_absent_message())


onsuccess:
    stop_engines()


onerror:
    stop_engines()
