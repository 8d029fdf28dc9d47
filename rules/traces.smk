# Shards merged with polars, every prompt accounted for, filtered, then split by id for training and
# validation. The prompt shards are inputs too: each generation shard must hold exactly its prompt
# shard's ids. The split is a rule of its own, with one input: every hidden-state job depends on a
# split, and Snakemake's cost of finding a dependency grows with the producer's input count.


rule merge_traces:
    input:
        generations=get_generation_shards,
        prompts=get_prompt_shards,
        server=rules.snapshot_server.output.identity,
        server_stopped=rules.stop_server.output,
    output:
        traces=f"{RESULTS}/traces/traces.parquet",
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


rule split_traces:
    input:
        rules.merge_traces.output.traces,
    output:
        train=f"{RESULTS}/traces/train.parquet",
        validation=f"{RESULTS}/traces/validation.parquet",
    log:
        f"{LOGS}/split_traces.log",
    script:
        "../scripts/split_traces.py"
