# Each question sent alone to the vLLM server; finished requests are journaled under work/ so that a
# killed or failed shard resumes without repeating or duplicating a request. preflight_generation runs
# once before the first shard: one short request and the prompts' token counts refuse in seconds a
# server that could not produce usable traces. Its output is small and holds only its findings, so a
# rerun that finds the same writes the same bytes and triggers nothing.
# With server.replicas, shard k goes to server k mod n (resources vllm_NAME, capped by max_shard_jobs),
# and preflight_replicas checks every replica at once after its identity check (check_replica).
from eagle3_pipeline.generate.payload import sampling_params, shard_params
from eagle3_pipeline.settings import runtime_params

# How a job reaches and paces the server: the server's identity (an input) and the sampling shape the
# answers; the unit's timeouts and the concurrency caps do not (generate/__init__.py): the generation.* a
# job does not record (the pacing, and for a preflight the history) and the primary's server section (a
# shard sent to a replica: fleet.for_shard).
PREFLIGHT_RUNTIME = runtime_only(
    server=SERVER, generation=runtime_params(SETTINGS.generation, "preflight")
)
SHARD_RUNTIME = runtime_only(
    server=SERVER, generation=runtime_params(SETTINGS.generation, "generate_shard")
)


rule preflight_generation:
    input:
        identity=rules.snapshot_server.output.identity,
        # the first block only: it never changes as num_samples grows, so adding shards does not rerun
        # the preflight (and with it every generation shard); its prompts are the fit check's sample
        selection=f"{RESULTS}/prompts/selection-00000.parquet",
        # ancient: adding a replica reruns that check, not this preflight (nor, below it, the shards)
        replicas_checked=ancient(rules.check_replicas.output[0]),
    output:
        f"{RESULTS}/generations/preflight.json",
    log:
        f"{LOGS}/preflight_generation.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        server_json=rules.snapshot_server.output.server,
        generation=sampling_params(SETTINGS.generation),
        runtime=PREFLIGHT_RUNTIME,
        state_dir=f"{WORK}/server",
    script:
        "../scripts/preflight_generation.py"


rule preflight_replicas:
    input:
        selection=rules.preflight_generation.input.selection,
        replicas_checked=rules.check_replicas.output[0],
    output:
        # one name whatever the replicas: the shards wait on it (ancient), so adding a replica reruns
        # this job and no finished shard
        summary=f"{RESULTS}/generations/replicas/preflight.json",
        replicas=expand(
            f"{RESULTS}/generations/replicas/{{replica}}/preflight.json",
            replica=REPLICAS,
        ),
    log:
        f"{LOGS}/preflight_replicas.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        generation=sampling_params(SETTINGS.generation),
        runtime=PREFLIGHT_RUNTIME,
        fleet=FLEET,  # no rerun trigger (not a builtin type): where each replica is
    script:
        "../scripts/preflight_replicas.py"


rule generate_shard:
    input:
        prompts=f"{RESULTS}/prompts/shard-{{shard}}.parquet",
        identity=rules.snapshot_server.output.identity,
        # the primary's preflight reruns with the sampling, and so do the shards; the replicas' is
        # ancient: a replica added reruns that preflight, not a finished shard. Not both in one job:
        # a job's rerun masks its dependents' own rerun triggers, and an ancient input hides them.
        preflight=rules.preflight_generation.output[0],
        replicas_preflight=ancient(rules.preflight_replicas.output.summary),
    output:
        f"{RESULTS}/generations/shard-{{shard}}.parquet",
    log:
        f"{LOGS}/generate_shard/{{shard}}.log",
    conda:
        "../envs/pipeline.yaml"
    resources:
        **get_server_resources(),
    params:
        server_json=rules.snapshot_server.output.server,
        # the sampling and generation.history (a no-op value left out: older params still match)
        generation=shard_params(SETTINGS.generation),
        runtime=SHARD_RUNTIME,
        journal=f"{WORK}/generations/shard-{{shard}}.jsonl",
        state_dir=f"{WORK}/server",
        # which server shard k is sent to; a Fleet is no rerun trigger (Snakemake records builtins only)
        fleet=FLEET,
    script:
        "../scripts/generate_shard.py"
