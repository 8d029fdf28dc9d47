# Every question of the dataset, with a stable id (a hash of its source row): prepare_prompts selects
# them in blocks of 64 shards (in selection order), write_prompt_shard cuts shard k out of its block.
#
# A block's content does not depend on dataset.num_samples: raising it adds blocks and shards and
# reruns none that is done, so nothing below a done shard (generation, traces, hidden states) is
# planned again. One job per shard, not one job with a file per shard: Snakemake walks all outputs
# of a dependency for every dependent job, so N outputs on one job made a dry run of 10,000 shards
# quadratic.


rule prepare_prompts:
    input:
        get_dataset_input(),
    output:
        selection=f"{RESULTS}/prompts/selection-{{block}}.parquet",
        skipped=f"{RESULTS}/prompts/skipped-{{block}}.parquet",
    log:
        f"{LOGS}/prepare_prompts/{{block}}.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        selection=get_selection_params(),
        rows=get_selection_block_rows,
    script:
        "../scripts/prepare_prompts.py"


localrules:
    write_prompt_shard,  # a slice of one file: less work than submitting a cluster job


rule write_prompt_shard:
    input:
        # not ancient(): with Snakemake 9, jobs below an ancient input of a job that reruns are not
        # checked at all, so new shards would never be planned (snakemake issue 4166)
        selection=get_selection_block,
    output:
        f"{RESULTS}/prompts/shard-{{shard}}.parquet",
    log:
        f"{LOGS}/write_prompt_shard/{{shard}}.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        rows=get_prompt_shard_rows,
    script:
        "../scripts/write_prompt_shard.py"
