# Every question of the dataset, with a stable id (a hash of its source row): prepare_prompts selects
# them (one file, in selection order), write_prompt_shard cuts shard k out of the selection.
#
# One job per shard, not one job with a file per shard: Snakemake walks all outputs of a dependency
# for every dependent job, so N outputs on one job made a dry run of 10,000 shards quadratic.


rule prepare_prompts:
    input:
        get_dataset_input(),
    output:
        selection=f"{RESULTS}/prompts/selection.parquet",
        skipped=f"{RESULTS}/prompts/skipped.parquet",
    log:
        f"{LOGS}/prepare_prompts.log",
    params:
        selection=get_selection_params(),
        num_samples=config["dataset"]["num_samples"],
    script:
        "../scripts/prepare_prompts.py"


localrules:
    write_prompt_shard,  # a slice of one file: less work than submitting a cluster job


rule write_prompt_shard:
    input:
        # not ancient(): with Snakemake 9, jobs below an ancient input of a job that reruns are not
        # checked at all, so new shards would never be planned (snakemake issue 4166)
        selection=rules.prepare_prompts.output.selection,
    output:
        f"{RESULTS}/prompts/shard-{{shard}}.parquet",
    log:
        f"{LOGS}/write_prompt_shard/{{shard}}.log",
    params:
        rows=get_prompt_shard_rows,
    script:
        "../scripts/write_prompt_shard.py"
