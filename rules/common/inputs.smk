# The inputs of the first stages: the unit file, the dataset, the selection blocks and prompt shards,
# the target's config.
from eagle3_pipeline.prompts import SELECTION_BLOCK_SHARDS, selection_block_rows
from eagle3_pipeline.settings import as_params


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
    params = as_params(SETTINGS.dataset, "path", "seed", "turns")
    if SETTINGS.generation.history == "own":
        params["history"] = "own"
    return params


def get_selection_block_rows(wildcards):
    """Questions [start, stop) of the selection order held by block b (independent of num_samples)."""
    start, stop = selection_block_rows(
        int(wildcards.block), SETTINGS.dataset.shard_size
    )
    return {"start": start, "stop": stop}


def get_selection_block(wildcards):
    """The selection block that holds shard k."""
    block = int(wildcards.shard) // SELECTION_BLOCK_SHARDS
    return f"{RESULTS}/prompts/selection-{block:05d}.parquet"


def get_prompt_shard_rows(wildcards):
    """Shard k's rows of its selection block: questions [k * shard_size, min((k + 1) * shard_size,
    num_samples)) of the order, less the block's first question."""
    size, total = SETTINGS.dataset.shard_size, SETTINGS.dataset.num_samples
    start = int(wildcards.shard) * size
    block_start, _ = selection_block_rows(
        int(wildcards.shard) // SELECTION_BLOCK_SHARDS, size
    )
    return {
        "start": start - block_start,
        "stop": min(start + size, total) - block_start,
    }


def get_target_config():
    return f"{SETTINGS.target.model}/config.json"


get_prompt_shards = shard_files(f"{RESULTS}/prompts/shard-{{shard}}.parquet")
get_generation_shards = shard_files(f"{RESULTS}/generations/shard-{{shard}}.parquet")
