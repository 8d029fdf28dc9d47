# The inputs of the first stages: the unit file, the dataset, the selection blocks and prompt shards,
# the target's config (rule require_target_weights, rules/hidden_states.smk, stands in where it is absent).
from pathlib import Path

from eagle3_pipeline.demo import demo_target_dir
from eagle3_pipeline.planning.blocks import (
    prompt_shard_rows,
    selection_block,
    selection_block_rows,
)
from eagle3_pipeline.settings import rerun_params


def get_unit_file_input():
    """The local unit file when the snapshot reads one (so the demo builder runs first)."""
    unit_file = SETTINGS.server.local_unit_file
    return [unit_file] if unit_file else []


def get_dataset_input():
    """The dataset as a file input, unless it is remote (hf://)."""
    path = SETTINGS.dataset.path
    return [] if "://" in path else [path]


def get_selection_params():
    """The dataset keys the selection depends on besides num_samples (shard_size only cuts it up),
    and generation.history when own (its units are conversations; absent, older params still match).
    """
    return rerun_params(SETTINGS.dataset, "prepare_prompts") | rerun_params(
        SETTINGS.generation, "prepare_prompts"
    )


def get_selection_block_rows(wildcards):
    """Questions [start, stop) of the selection order held by block b (independent of num_samples)."""
    start, stop = selection_block_rows(
        int(wildcards.block), SETTINGS.dataset.shard_size
    )
    return {"start": start, "stop": stop}


def get_selection_block(wildcards):
    """The selection block that holds shard k."""
    block = selection_block(int(wildcards.shard))
    return f"{RESULTS}/prompts/selection-{block:05d}.parquet"


def get_prompt_shard_rows(wildcards):
    """Shard k's rows of its selection block (planning.blocks.prompt_shard_rows)."""
    dataset = SETTINGS.dataset
    start, stop = prompt_shard_rows(
        int(wildcards.shard), dataset.shard_size, dataset.num_samples
    )
    return {"start": start, "stop": stop}


# The target's config.json: an input of every job that reads the target (the disk check, extraction,
# the draft's rules). Where it is neither on this machine nor built by a rule (the demo's target, rules/
# demo.smk), those jobs take instead the output of require_target_weights (rules/hidden_states.smk), a
# job that only fails. So a dry run (snakemake -n, make plan, under profiles/slurm too) still plans every
# job, from the config alone (target.hidden_size sizes the windows under a disk cap, in
# planning.disk_cap.parse_time_hidden_size), and a real run stops at once, naming the folder, before any
# job that needs the weights. With the weights here (or the demo's target built by its rule) the jobs' inputs
# are the config.json as ever.
TARGET_CONFIG = f"{SETTINGS.target.model}/config.json"
TARGET_BUILT = SETTINGS.demo.enabled and Path(TARGET_CONFIG) == Path(
    demo_target_dir(SETTINGS.demo.family), "config.json"  # build_demo_target's output
)
TARGET_ABSENT = not (TARGET_BUILT or Path(TARGET_CONFIG).exists())


def get_target_config():
    return f"{WORK}/target/config.json.absent" if TARGET_ABSENT else TARGET_CONFIG


def target_absent_message():
    """What a real run without the target's weights says (rule require_target_weights)."""
    return (
        f"target.model: {TARGET_CONFIG} does not exist on this machine. The plan was made without the "
        "target's weights (from the config alone: target.hidden_size sizes a disk cap's windows), but "
        "check_disk_budget, extract_hidden_states and the draft's rules read them: put the weights "
        "there (or point target.model at them) and run again; --keep-going runs meanwhile every job "
        "that does not need them (the prompts, generation and traces)."
    )


get_prompt_shards = shard_files(f"{RESULTS}/prompts/shard-{{shard}}.parquet")
get_generation_shards = shard_files(f"{RESULTS}/generations/shard-{{shard}}.parquet")
