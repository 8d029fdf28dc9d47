# Every question of the dataset, with a stable id (a hash of its source row), in fixed-membership shards.


rule prepare_prompts:
    input:
        get_dataset_input(),
    output:
        shards=expand(f"{RESULTS}/prompts/shard-{{shard}}.parquet", shard=SHARDS),
        skipped=f"{RESULTS}/prompts/skipped.parquet",
    log:
        f"{LOGS}/prepare_prompts.log",
    params:
        dataset=config["dataset"],
    script:
        "../scripts/prepare_prompts.py"
