# Each question sent alone to the vLLM server; finished requests are journaled under work/ so that a
# killed shard resumes without repeating or duplicating a request.


rule generate_shard:
    input:
        prompts=f"{RESULTS}/prompts/shard-{{shard}}.parquet",
        identity=rules.snapshot_server.output.identity,
    output:
        f"{RESULTS}/generations/shard-{{shard}}.parquet",
    log:
        f"{LOGS}/generate_shard/{{shard}}.log",
    params:
        server_json=rules.snapshot_server.output.server,
        server=config["server"],
        generation=config["generation"],
        journal=f"{WORK}/generations/shard-{{shard}}.jsonl",
        state_dir=f"{WORK}/server",
    script:
        "../scripts/generate_shard.py"
