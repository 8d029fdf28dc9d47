# Each question sent alone to the vLLM server; finished requests are journaled under work/ so that a
# killed or failed shard resumes without repeating or duplicating a request. preflight_generation runs
# once before the first shard: one short request and the prompts' token counts refuse in seconds a
# server that could not produce usable traces. Its output is small and holds only its findings, so a
# rerun that finds the same writes the same bytes and triggers nothing.
from eagle3_pipeline.generate.payload import rule_params, sampling_params

# How a shard job reaches and paces the server: the server's identity (an input) and the sampling
# shape the answers; the unit's timeouts and the concurrency caps do not.
GENERATION_RUNTIME = runtime_only(
    server=as_params(SETTINGS.server),
    generation=as_params(SETTINGS.generation, *GENERATION_PACING),
)


rule preflight_generation:
    input:
        identity=rules.snapshot_server.output.identity,
        # the first block only: it never changes as num_samples grows, so adding shards does not rerun
        # the preflight (and with it every generation shard); its prompts are the fit check's sample
        selection=f"{RESULTS}/prompts/selection-00000.parquet",
    output:
        f"{RESULTS}/generations/preflight.json",
    log:
        f"{LOGS}/preflight_generation.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        server_json=rules.snapshot_server.output.server,
        generation=sampling_params(config["generation"]),
        runtime=GENERATION_RUNTIME,
        state_dir=f"{WORK}/server",
    script:
        "../scripts/preflight_generation.py"


rule generate_shard:
    input:
        prompts=f"{RESULTS}/prompts/shard-{{shard}}.parquet",
        identity=rules.snapshot_server.output.identity,
        preflight=rules.preflight_generation.output[0],
    output:
        f"{RESULTS}/generations/shard-{{shard}}.parquet",
    log:
        f"{LOGS}/generate_shard/{{shard}}.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        server_json=rules.snapshot_server.output.server,
        # the sampling and generation.history (a no-op value left out: older params still match)
        generation=rule_params(
            {
                key: value
                for key, value in config["generation"].items()
                if key not in GENERATION_PACING
            }
        ),
        runtime=GENERATION_RUNTIME,
        journal=f"{WORK}/generations/shard-{{shard}}.jsonl",
        state_dir=f"{WORK}/server",
    script:
        "../scripts/generate_shard.py"
