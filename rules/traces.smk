# Shards merged with polars, every prompt accounted for, filtered, split by id for training/validation.
# The prompt shards are inputs too: each generation shard must hold exactly its prompt shard's ids.


rule merge_traces:
    input:
        generations=get_generation_shards(),
        prompts=rules.prepare_prompts.output.shards,
        server=rules.snapshot_server.output.identity,
        server_stopped=rules.stop_server.output,
    output:
        traces=f"{RESULTS}/traces/traces.parquet",
        train=f"{RESULTS}/traces/train.parquet",
        validation=f"{RESULTS}/traces/validation.parquet",
        stats=f"{RESULTS}/traces/stats.json",
        conversations=f"{RESULTS}/traces/conversations.jsonl",
        lengths_plot=report(f"{RESULTS}/traces/plots/lengths.png", category="Traces"),
        counts_plot=report(f"{RESULTS}/traces/plots/counts.png", category="Traces"),
    log:
        f"{LOGS}/merge_traces.log",
    params:
        traces=config["traces"],
    script:
        "../scripts/merge_traces.py"
