# The target run over each full conversation (prompt + thinking + answer, the server's own token ids);
# three auxiliary layers and the final one stored packed in bf16, one file per shard and split.
# One job per shard writes every split's file: the target is loaded once, not once per split. Shard k
# reads shard k's traces only: adding shards extracts the new ones and reruns no done one.
# hidden_states.backend: vllm (the serving engine, its settings from the snapshot) or transformers.


from eagle3_pipeline.config import SPLITS
from eagle3_pipeline.hidden_states.job import recorded_launch_mode
from eagle3_pipeline.settings import RuntimeWord, rerun_params

# hidden_states.* the states depend on: each a param of its own (a rerun trigger), hidden_states.vllm's
# as one (vllm); the script reads them back into HiddenStatesSettings with the run-time values
# (engine_runtime in common/engine.smk)
EXTRACTION_PARAMS = rerun_params(SETTINGS.hidden_states, "extract_hidden_states")


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
        # vllm: its scope's engine job (serve_extraction_engine), whatever reruns this job
        engine=get_engine_service,
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
    # vllm: no core of its own: Snakemake sums a group's cores and starts all its jobs at once (the
    # clients take hidden_states.vllm.max_clients slots of their engine: engine.client_slot)
    threads: 0 if VLLM_ENGINE else 1
    resources:
        # transformers: the job runs the target (a 1T MoE needs all 8: set-resources in the profile).
        # vllm: the job is a client of its engine job, which holds the GPUs; its memory is the
        # profile's mem_mb (its floor: summed over the group) and its time its engine's
        **({} if VLLM_ENGINE else gpu_request(1)),
        **({"runtime": get_client_time_limit} if VLLM_ENGINE else {}),
    params:
        **EXTRACTION_PARAMS,
        # only a rerun trigger (the target's placement under transformers), as it always was recorded
        launch_mode=recorded_launch_mode(SETTINGS.hidden_states),
        # device_map, pack_slots and their folder, the engine's folder and pacing: no rerun trigger
        runtime=get_engine_runtime,
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
# job of its own (baseline_serve_extraction_engine), run once the main draft's GPU jobs are done, so
# that nothing of the main draft depends on the baseline.
use rule extract_hidden_states as baseline_extract_hidden_states with:
    input:
        traces=[rules.baseline_traces.output[0]],
        target=get_target_config(),
        server_stopped=ancient(rules.stop_server.output[0]),
        after=get_baseline_extraction_gate,
        engine=get_baseline_engine_service,
    output:
        states=[f"{RESULTS}/{BASELINE}hidden_states/train/shard-{{shard}}.safetensors"],
        metadata=[f"{RESULTS}/{BASELINE}hidden_states/train/shard-{{shard}}.json"],
    log:
        f"{LOGS}/{BASELINE}extract_hidden_states/{{shard}}.log",
    params:
        runtime=get_baseline_engine_runtime,
        work=f"{WORK}/{BASELINE}hidden_states/{{shard}}",


if VLLM_ENGINE:

    # The extraction engine of one scope, a job of its own: its service() output is consumed by every
    # extraction job of its scope (get_engine_service), and Snakemake runs the ones it runs and this
    # job as one group (one submission on one node under profiles/slurm), starting them together and
    # terminating this job once they are done. It holds the GPUs; no job of it at all when no
    # extraction job of its scope runs: its inputs are ancient and its params unrecorded, so it never
    # reruns by itself. It reads the config's hidden_states as its clients do (they check its settings).
    rule serve_extraction_engine:
        input:
            target=ancient(get_target_config()),
            server_stopped=ancient(rules.stop_server.output[0]),
        output:
            service(f"{ENGINE_DIR}/{ENGINE_SERVICE}"),
        log:
            f"{LOGS}/serve_extraction_engine/{ENGINE_SCOPE}.log",
        conda:
            "../envs/pipeline.yaml"
        threads: 1
        resources:
            # the GPUs in the profile's form; with the profile's engine_mem_mb and engine_cpus, its
            # own plus its clients' packing, and the scope's time limit from the plan (common/engine.smk)
            **engine_resources("serve_extraction_engine"),
        params:
            job=get_engine_job,  # its settings and paths (engine_job.py): no rerun trigger (a service)
            server_json=rules.snapshot_server.output.server,
            python=JOB_PYTHON,  # its environment's (common/engine.smk), as a script: job's
        # shell and exec, not script: Snakemake ends a service job by signalling the process of a
        # shell command (a script's is never signalled); the output first: every extraction job of
        # the group waits --latency-wait seconds for it
        shell:
            "touch {output:q} && exec {params.python:q} -m eagle3_pipeline.hidden_states.engine_job "
            "{params.job:q} {input.target:q} {params.server_json:q} {log:q}"

    # The baseline's engine, for the baseline's extraction jobs, after the main draft's GPU jobs
    use rule serve_extraction_engine as baseline_serve_extraction_engine with:
        output:
            service(f"{BASELINE_ENGINE_DIR}/{ENGINE_SERVICE}"),
        log:
            f"{LOGS}/serve_extraction_engine/{BASELINE}hidden_states/engine.log",
        resources:
            **engine_resources("baseline_serve_extraction_engine"),
        params:
            job=get_baseline_engine_job,
            server_json=rules.snapshot_server.output.server,
            python=JOB_PYTHON,


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
