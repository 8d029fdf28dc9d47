# Per shard (filter_traces): generation shard k checked against its prompt shard and the server
# identity, filtered and split by id; hidden-state shard k reads these files only, so adding shards
# re-extracts none that is done. Over the corpus (merge_traces, split_traces): the same rows merged with
# polars, checked across shards (an id in two shards), counted, plotted and exported; nothing waits
# for them but the report and the serve check.

from eagle3_pipeline.settings import rerun_params, runtime_params

# The traces.* keys that decide which rows are kept and on which side of the split they land (the
# settings.TraceFilters that filter_traces receives)
TRACE_FILTERS = rerun_params(SETTINGS.traces, "filter_traces")


rule filter_traces:
    input:
        generation=f"{RESULTS}/generations/shard-{{shard}}.parquet",
        prompts=f"{RESULTS}/prompts/shard-{{shard}}.parquet",
        server=rules.snapshot_server.output.identity,
    output:
        train=f"{RESULTS}/traces/shards/train/shard-{{shard}}.parquet",
        validation=f"{RESULTS}/traces/shards/validation/shard-{{shard}}.parquet",
    log:
        f"{LOGS}/filter_traces/{{shard}}.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        traces=TRACE_FILTERS,
    script:
        "../scripts/filter_traces.py"


rule merge_traces:
    input:
        generations=get_generation_shards,
        prompts=get_prompt_shards,
        server=rules.snapshot_server.output.identity,
        server_stopped=ancient(rules.stop_server.output[0]),
    output:
        traces=f"{RESULTS}/traces/traces.parquet",
        stats=f"{RESULTS}/traces/stats.json",
        conversations=f"{RESULTS}/traces/conversations.jsonl",
        lengths_plot=report(
            f"{RESULTS}/traces/plots/lengths.png",
            category="2. Traces",
            labels={"figure": "Trace lengths by source"},
        ),
        counts_plot=report(
            f"{RESULTS}/traces/plots/counts.png",
            category="2. Traces",
            labels={"figure": "Trace counts"},
        ),
    log:
        f"{LOGS}/merge_traces.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        traces=rerun_params(SETTINGS.traces, "merge_traces"),
        # max_failed_fraction, a threshold the merge checks: raising it after a refused merge reruns
        # no shard's filter (and so no extraction downstream)
        runtime=runtime_only(traces=runtime_params(SETTINGS.traces, "merge_traces")),
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
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/split_traces.py"


# The baseline's traces (validate.baseline): shard k's training rows answered with the dataset's
# original answers instead of the target's; the draft's rules then run on them as variant baseline/.
rule baseline_traces:
    input:
        rules.filter_traces.output.train,
    output:
        f"{RESULTS}/{BASELINE}traces/shards/train/shard-{{shard}}.parquet",
    log:
        f"{LOGS}/{BASELINE}baseline_traces/{{shard}}.log",
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/baseline_traces.py"
