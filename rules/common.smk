# Config validation, the shard list, wildcard constraints and get_* helpers. Nothing here touches the
# network, a server, a GPU or a dataset: a dry run of 10,000 shards must plan in seconds.
from eagle3_pipeline.config import SPLITS, check_config, shard_ids

check_config(config, workflow.source_path("../config/schema.yaml"))

RESULTS = f"results/{config['run']}"
LOGS = f"{RESULTS}/logs"
WORK = f"{RESULTS}/work"
SHARDS = shard_ids(config["dataset"]["num_samples"], config["dataset"]["shard_size"])


wildcard_constraints:
    shard=r"\d{5}",
    split="train|validation",


def shard_files(*patterns):
    """An input function giving each pattern's file for every shard.

    A function rather than a list: Snakemake hashes a list input once per file in it when the rule
    also names another rule's output, which is quadratic in the shard count.
    """
    files = [path for pattern in patterns for path in expand(pattern, shard=SHARDS)]

    def get_shard_files(wildcards):
        return files

    return get_shard_files


def get_unit_file_input():
    """The local unit file when the snapshot reads one (so the demo builder runs first)."""
    unit_file = config["server"]["unit_file"]
    return [unit_file] if config["server"]["host"] == "local" and unit_file else []


def get_dataset_input():
    """The dataset as a file input, unless it is remote (hf://)."""
    path = config["dataset"]["path"]
    return [] if "://" in path else [path]


def get_selection_params():
    """The dataset keys the selection depends on besides num_samples (shard_size only cuts it up),
    and generation.history when own (its units are conversations; absent, older params still match)."""
    params = {key: config["dataset"][key] for key in ("path", "seed", "turns")}
    if config["generation"]["history"] == "own":
        params["history"] = "own"
    return params


def get_prompt_shard_rows(wildcards):
    """Shard k's rows of the selection: [k * shard_size, min((k + 1) * shard_size, num_samples))."""
    size, total = config["dataset"]["shard_size"], config["dataset"]["num_samples"]
    start = int(wildcards.shard) * size
    return {"start": start, "stop": min(start + size, total)}


def get_target_config():
    return f"{config['target']['model']}/config.json"


def get_draft_shape_args():
    """--head-dim/--num-attention-heads/--num-key-value-heads for the draft.* keys that are set."""
    keys = ("head_dim", "num_attention_heads", "num_key_value_heads")
    return " ".join(
        f"--{k.replace('_', '-')} {config['draft'][k]}"
        for k in keys
        if config["draft"].get(k) is not None
    )


get_prompt_shards = shard_files(f"{RESULTS}/prompts/shard-{{shard}}.parquet")
get_generation_shards = shard_files(f"{RESULTS}/generations/shard-{{shard}}.parquet")
get_hidden_state_shards = shard_files(
    *(
        f"{RESULTS}/hidden_states/{split}/shard-{{shard}}.safetensors"
        for split in SPLITS
    )
)


def get_final_outputs():
    outputs = [
        f"{RESULTS}/traces/stats.json",
        f"{RESULTS}/draft/checkpoint/config.json",
        f"{RESULTS}/validation/offline.json",
        f"{RESULTS}/report/acceptance.png",  # rule plot_validation: every picture of the report
    ]
    if config["validate"]["serve_check"]:
        outputs.append(f"{RESULTS}/validation/serve_check.json")
    return outputs
