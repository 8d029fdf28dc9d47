# Config validation, the shard list, wildcard constraints and get_* helpers. Nothing here touches the
# network, a server, a GPU or a dataset: a dry run of 10,000 shards must plan in seconds.
# The conda environment of every step is ../envs/pipeline.yaml (generated from envs/*.txt by
# envs/conda_envs.py); Snakemake builds and uses it only under --use-conda (a cluster without the
# project's virtualenvs), and ignores it otherwise.
import sys
from pathlib import Path

from eagle3_pipeline.budget import (
    capped_window_shards,
    epoch_windows,
    parse_time_hidden_size,
)
from eagle3_pipeline.config import SPLITS, ConfigError, check_config, shard_ids
from eagle3_pipeline.hidden_states.engine import stop_all
from eagle3_pipeline.prompts import SELECTION_BLOCK_SHARDS, selection_block_rows
from eagle3_pipeline.server.replicas import (
    assigned_server,
    fleet,
    resource_name,
    shard_caps,
)
from eagle3_pipeline.settings import (
    TRAIN_RUNTIME_KEYS,
    as_params,
    build_settings,
    runtime_only,
)
from eagle3_pipeline.validate.learning_curve import curve_points, variant_name
from eagle3_pipeline.validate.selection import kept_epochs

check_config(config, workflow.source_path("../config/schema.yaml"))
# The config as typed, frozen sections. Params are rerun triggers (rerun-triggers in profiles/): a
# rule passes as params only what its output depends on (as_params), and what a job needs only while
# it runs (timeouts, pacing, how to reach a server whose identity is an input) as runtime_only(...),
# an object Snakemake does not record (eagle3_pipeline.settings.RuntimeOnly): changing it reruns nothing.
SETTINGS = build_settings(config)

RESULTS = f"results/{SETTINGS.run}"
LOGS = f"{RESULTS}/logs"
WORK = f"{RESULTS}/work"
SHARDS = shard_ids(SETTINGS.dataset.num_samples, SETTINGS.dataset.shard_size)
# hidden_states.max_disk_gb: shards per training window, from the config alone (None: no cap, every
# shard's states kept). Under a cap, epoch e's states of window w are extracted, trained on by
# train_draft_window and deleted; a cap below one shard is refused here, with the numbers. The cap
# also holds the two training state files windowed training keeps at once (budget.py).
WINDOW = (
    capped_window_shards(SETTINGS, parse_time_hidden_size(SETTINGS))
    if SETTINGS.hidden_states.max_disk_gb is not None
    else None
)
EPOCHS = SETTINGS.train.epochs
# Per epoch, its windows: the shards in an order seeded by train.seed and the epoch, cut into windows
# of WINDOW (budget.epoch_windows; plan_windows records them), so each epoch groups them anew.
EPOCH_WINDOWS = (
    [epoch_windows(SETTINGS.train.seed, e, SHARDS, WINDOW) for e in range(EPOCHS)]
    if WINDOW
    else []
)
WINDOW_COUNT = len(EPOCH_WINDOWS[0]) if WINDOW else 0  # windows per epoch
SHARD_WINDOW = [
    {k: w for w, shards in enumerate(windows) for k in shards}
    for windows in EPOCH_WINDOWS
]


def window_of(epoch, shard):
    """The window that trains on shard `shard` in epoch `epoch`."""
    return SHARD_WINDOW[int(epoch)][shard]


def window_shards(epoch, window):
    """The shards of window `window` of epoch `epoch`."""
    return EPOCH_WINDOWS[int(epoch)][int(window)]


# The windows form one chain of epochs x windows training jobs, and Snakemake builds its DAG
# recursively (about 3 Python frames per link, measured): room for the chain, as for a long DAG.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 2000 + 10 * EPOCHS * WINDOW_COUNT))
if WINDOW and SETTINGS.validate.baseline:
    raise ConfigError(
        "hidden_states.max_disk_gb with validate.baseline: the baseline draft is not trained in "
        "windows; set validate.baseline: false (or hidden_states.max_disk_gb: null)"
    )
# Where extraction writes: one folder per epoch under a cap (each epoch extracts anew)
EPOCH_DIR = "epoch-{epoch}/" if WINDOW else ""
STATES = f"{RESULTS}/hidden_states/{EPOCH_DIR}".rstrip("/")
# The vllm backend's extraction engine (hidden_states/engine.py): one long-lived engine serves every
# extraction job of its scope (the main shards, or under a cap one epoch's window; the baseline's
# shards have a scope of their own), started by the first job with batches to run and stopped by
# stop_extraction_engine, which the GPU training rules wait on.
VLLM_ENGINE = SETTINGS.hidden_states.backend == "vllm"
ENGINE_ROOT = f"{WORK}/hidden_states/engine"
ENGINE_DIR = (
    f"{ENGINE_ROOT}/epoch-{{epoch}}-window-{{window}}" if WINDOW else ENGINE_ROOT
)
ENGINE_SCOPE = ENGINE_DIR.removeprefix(f"{WORK}/")  # its logs' names
# hidden_states.vllm keys that pace or place the engine without changing a state: run-time only
ENGINE_RUNTIME_KEYS = (
    "staging_dir",
    "max_in_flight_tokens",
    "max_clients",
    "idle_timeout_s",
)
# the other hidden_states.vllm keys: recorded params of extract_hidden_states (rerun triggers)
ENGINE_PARAMS = {
    key: value
    for key, value in as_params(SETTINGS.hidden_states.vllm).items()
    if key not in ENGINE_RUNTIME_KEYS
}
if VLLM_ENGINE and "extraction_clients" not in workflow.global_resources:
    # jobs feeding one engine at once (one plans or packs while another's batches run)
    workflow.global_resources["extraction_clients"] = (
        SETTINGS.hidden_states.vllm.max_clients
    )
# The draft variants, as the {variant} wildcard of the draft's rules (vocab_map .. serve_check): ""
# is the main draft, trained on the target's own traces, at results/{run}/draft/ etc.; "baseline/"
# (validate.baseline) the same rules on the dataset's original answers at results/{run}/baseline/.
BASELINE = "baseline/"
# the baseline's extraction engine (its own scope: nothing of the main draft waits on it)
BASELINE_ENGINE_DIR = f"{WORK}/{BASELINE}hidden_states/engine"
VARIANTS = ["", BASELINE] if SETTINGS.validate.baseline else [""]
# validate.learning_curve: the main draft's rules again on its first k training shards (nested subsets
# of the stable order, on the main draft's hidden states), as the variants learning_curve/shards-{k}/;
# k = every shard is the main draft itself. CURVE: {variant: k} of the points trained apart.
CURVE_POINTS = curve_points(SETTINGS.validate.learning_curve, len(SHARDS))
CURVE = {variant_name(k, len(SHARDS)): k for k in CURVE_POINTS if k < len(SHARDS)}
VARIANTS += list(CURVE)
if WINDOW and CURVE_POINTS:
    raise ConfigError(
        "hidden_states.max_disk_gb with validate.learning_curve: no hidden states are kept to train the "
        "subsets on; set validate.learning_curve: [] (or hidden_states.max_disk_gb: null)"
    )


def variant_shards(variant):
    """The training shards of a variant: the first k for a learning-curve point, else all."""
    return SHARDS[: CURVE[variant]] if variant in CURVE else SHARDS


def states_of(variant):
    """Whose hidden states a variant trains on: a learning-curve point on the main draft's."""
    return "" if variant in CURVE else variant


# validate.select_every_epochs: the epochs whose weights training keeps, the candidates of
# select_checkpoint (rules/validate.smk); none: the last epoch's weights are exported as trained.
KEPT_EPOCHS = kept_epochs(EPOCHS, SETTINGS.validate.select_every_epochs)


def get_export_weights(wildcards):
    """What export_draft ships: the epoch select_checkpoint chose, else the last epoch's weights."""
    folder = "selected" if KEPT_EPOCHS else "trained"
    return f"{RESULTS}/{wildcards.variant}draft/{folder}/model.safetensors"


def get_export_metadata(wildcards):
    """The first training shard's metadata of the states the variant trained on (its layer numbering
    and final-state kind)."""
    states = f"{RESULTS}/{states_of(wildcards.variant)}hidden_states"
    return f"{states}/{EPOCH_DIR.format(epoch=0)}train/shard-{SHARDS[0]}.json"


wildcard_constraints:
    shard=r"\d{5}",
    block=r"\d{5}",
    split="train|validation",
    epoch=r"\d+",
    window=r"\d+",
    # "(?:)" for the main draft alone: an empty constraint would mean none (any non-empty name)
    variant="|".join(f"(?:{variant})" for variant in VARIANTS),


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


def variant_files(*patterns):
    """An input function giving, for the job's {variant}, each pattern's file for every shard (a
    pattern's {variant} is the job's); lists made once per variant, as in shard_files.
    """
    files = {
        variant: [
            path
            for pattern in patterns
            for path in expand(
                pattern, shard=variant_shards(variant), variant=states_of(variant)
            )
        ]
        for variant in VARIANTS
    }

    def get_variant_files(wildcards):
        return files[wildcards.variant]

    return get_variant_files


def variant_output(output, variant=BASELINE):
    """A draft rule's output pattern (with {variant}) for one variant."""
    return expand(output, variant=variant)[0]


# A variant's training states: its own train split; validation is always the main draft's (the
# target's own validation traces, every shard), so every draft is measured on the same held-out data.
# A learning-curve point trains on its k shards alone (no validation figures in its history): a shard
# added later retrains no point whose k it leaves as it was, only remeasures it.
get_variant_train_states = variant_files(
    f"{RESULTS}/{{variant}}hidden_states/train/shard-{{shard}}.safetensors"
)
get_main_validation_states = shard_files(
    f"{RESULTS}/hidden_states/validation/shard-{{shard}}.safetensors"
)


def get_draft_validation_states(wildcards):
    return [] if wildcards.variant in CURVE else get_main_validation_states(wildcards)


def window_training_state(epoch, window):
    """The training state (weights, optimiser, schedule) after window `window` of epoch `epoch` (a temp
    file: kept until used)."""
    return f"{RESULTS}/draft/windows/epoch-{epoch}/window-{window}.pt"


def previous_window_training_state(epoch, window):
    """The training state a window starts from: the previous window's, the last of the previous epoch,
    or none."""
    if window > 0:
        return [window_training_state(epoch, window - 1)]
    if epoch > 0:
        return [window_training_state(epoch - 1, WINDOW_COUNT - 1)]
    return []


def get_extraction_gate(wildcards):
    """Under a cap, shard k of epoch e is extracted only once the previous window is trained on (and
    its states deleted): the disk never holds two windows."""
    if not WINDOW:
        return []
    epoch = int(wildcards.epoch)
    return previous_window_training_state(epoch, window_of(epoch, wildcards.shard))


def engine_dir(epoch=None, shard=None):
    """The extraction engine folder of shard `shard` (of epoch `epoch` under a cap)."""
    if not WINDOW:
        return ENGINE_DIR
    return ENGINE_DIR.format(epoch=epoch, window=window_of(epoch, shard))


def engine_runtime(where):
    """An extraction job's run-time values (not recorded: see runtime_only): hidden_states.device_map
    (recorded through launch_mode), the engine's run-time keys, its folder and its log.
    """
    scope = where.removeprefix(f"{WORK}/") if where else None
    return runtime_only(
        hidden_states={
            "device_map": SETTINGS.hidden_states.device_map,
            "vllm": as_params(SETTINGS.hidden_states.vllm, *ENGINE_RUNTIME_KEYS),
        },
        engine={
            "dir": where,
            "log": f"{LOGS}/extraction_engine/{scope}.log" if where else None,
        },
    )


def get_engine_runtime(wildcards):
    where = engine_dir(wildcards.get("epoch"), wildcards.shard) if VLLM_ENGINE else None
    return engine_runtime(where)


def get_baseline_engine_runtime(wildcards):
    return engine_runtime(BASELINE_ENGINE_DIR if VLLM_ENGINE else None)


def get_engine_stopped(wildcards):
    """What a GPU training job waits for: the extraction engine of its states stopped (its GPUs free).

    An order, not data: ancient, so that the stop report rewritten for new shards reruns no training
    by itself (the new states do). Each variant waits on its own engine's scope only, so turning the
    baseline on or off changes no input of the main draft's jobs."""
    if not VLLM_ENGINE:
        return []
    if WINDOW:
        folder = ENGINE_DIR.format(epoch=wildcards.epoch, window=wildcards.window)
    else:
        # a learning-curve point trains on the main states, yet waits on the baseline's engine too:
        # it never holds the GPUs beside one
        variant = wildcards.get("variant")
        baseline = variant == BASELINE or (
            variant in CURVE and SETTINGS.validate.baseline
        )
        folder = BASELINE_ENGINE_DIR if baseline else ENGINE_ROOT
    return [ancient(f"{folder}/stopped.json")]


def get_engine_clients(wildcards):
    """The main extraction jobs one engine serves (their metadata): its stop runs after all of them."""
    if WINDOW:
        return [
            f"{RESULTS}/hidden_states/epoch-{wildcards.epoch}/{split}/shard-{k}.json"
            for split in SPLITS
            for k in window_shards(wildcards.epoch, wildcards.window)
        ]
    return [
        f"{RESULTS}/hidden_states/{split}/shard-{k}.json"
        for split in SPLITS
        for k in SHARDS
    ]


get_baseline_engine_clients = shard_files(
    f"{RESULTS}/{BASELINE}hidden_states/train/shard-{{shard}}.json"
)


def get_baseline_extraction_gate(wildcards):
    """The baseline's extraction starts its engine once the main draft's last GPU job (offline
    validation, after its training, after the main engine's stop) is done: two engines never hold the
    GPUs together, nor an engine and a training job. Ancient: the main draft retrained reruns no
    baseline extraction; the main never waits on the baseline (validate.baseline toggles replan none
    of its jobs). The main serve check becomes ready at the same moment and runs first, alone
    (get_serve_check_resources): the baseline's engine never skews its timing.
    """
    if not VLLM_ENGINE:
        return []  # transformers: every extraction job holds the GPUs (resource gpu)
    return [ancient(f"{RESULTS}/validation/offline.json")]


def get_serve_check_resources():
    """draft_server, and what keeps the check's timing its own: the served check must not share the
    box with an extraction engine at work or a GPU job. With validate.baseline, the baseline's
    extraction becomes ready with the main check (both wait for the main offline validation,
    get_baseline_extraction_gate); the check goes first (its priority) and holds every extraction-client
    slot, so no extraction job (each keeps its engine busy) starts beside it. The baseline's engine is
    started by its first client, after the check, and stopped before the baseline trains; the check
    cannot become ready later (every input of it is done before the gate). Locally the check's vLLM runs on
    this box's accelerators: it holds all of them (resource gpu). Resources, not a DAG edge: the main
    draft never waits on the baseline, so toggling validate.baseline replans none of its jobs.
    """
    resources = {"draft_server": 1}
    if VLLM_ENGINE:
        resources["extraction_clients"] = resource_limit("extraction_clients")
    gpus = resource_limit("gpu")
    if SETTINGS.server.host == "local" and isinstance(gpus, int):
        resources["gpu"] = gpus
    return resources


def get_serve_check_settings(wildcards):
    """The check's own validate.* keys. validate.speedup for the main draft only: the target alone,
    timed on the same questions, is the same run for every variant, and the report shows the main
    draft's speedup; the baseline is compared by acceptance (a vLLM start and a timed run saved).
    """
    keys = as_params(
        SETTINGS.validate,
        "num_speculative_tokens",
        "max_questions",
        "max_tokens",
        "temperature",
        "enforce_eager",
        "served_offline_tolerance",
        "speedup",
    )
    if wildcards.variant == BASELINE:
        keys["speedup"] = False
    return keys


def resource_limit(name):
    """The run's limit on resource `name` (the command line's or the profile's, a Resource there, or
    one set by these rules); None when unlimited."""
    limit = workflow.global_resources.get(name)
    return getattr(limit, "value", limit)


def stop_engines():
    """onsuccess/onerror: no extraction engine outlives the snakemake call that started it."""
    for root in (ENGINE_ROOT, BASELINE_ENGINE_DIR):
        if VLLM_ENGINE and Path(root).exists():
            for report in stop_all(Path(root)):
                if report.get("stopped"):
                    print(
                        f"extraction engine {report.get('start_id')}: {report['stopped']}"
                    )


def get_previous_window_training_state(wildcards):
    return previous_window_training_state(int(wildcards.epoch), int(wildcards.window))


def get_window_training_runtime(wildcards):
    """train_draft_window's run-time values: train's and the window's shard ids (checked against the
    plan's; known here, not parsed back out of the states' paths)."""
    return runtime_only(
        train=as_params(SETTINGS.train, *TRAIN_RUNTIME_KEYS),
        window={"shards": window_shards(wildcards.epoch, wildcards.window)},
    )


def window_hidden_states(split):
    """An input function: epoch e's hidden states of split `split` of window w's shards, in shard order."""

    def get_window_hidden_states(wildcards):
        return [
            f"{RESULTS}/hidden_states/epoch-{wildcards.epoch}/{split}/shard-{k}.safetensors"
            for k in window_shards(wildcards.epoch, wildcards.window)
        ]

    return get_window_hidden_states


def get_validation_states():
    """What offline validation reads: every shard's validation states, or under a cap the last
    window's of the last epoch (still on disk: validation is their last reader)."""
    if not WINDOW:
        return shard_files(
            f"{RESULTS}/hidden_states/validation/shard-{{shard}}.safetensors"
        )
    return [
        f"{RESULTS}/hidden_states/epoch-{EPOCHS - 1}/validation/shard-{k}.safetensors"
        for k in window_shards(EPOCHS - 1, WINDOW_COUNT - 1)
    ]


def get_final_outputs():
    outputs = [
        f"{RESULTS}/traces/stats.json",
        f"{RESULTS}/draft/checkpoint/config.json",
        f"{RESULTS}/validation/offline.json",
        f"{RESULTS}/report/acceptance.png",  # asks for every picture of the report (plot_validation)
    ]
    if SETTINGS.validate.serve_check:
        outputs.append(f"{RESULTS}/validation/serve_check.json")
    return outputs


# server.replicas (server/replicas.py): more servers of the same model, shard k on server k mod n.

FLEET = fleet(SETTINGS.server, RESULTS, WORK)
REPLICAS = [server.name for server in FLEET.replicas]
# the primary's own section (less its replicas) as plain values: run-time only (runtime_only), so
# adding a replica reruns nothing
SERVER = as_params(FLEET.primary.settings)
# server.max_shard_jobs caps as global resources (a --resources NAME=N given on the command line
# wins): Snakemake's scheduler counts them over every job it runs or submits, on any node
for _name, _cap in shard_caps(SETTINGS.server).items():
    if _cap is not None and resource_name(_name) not in workflow.global_resources:
        workflow.global_resources[resource_name(_name)] = _cap


def get_replica(wildcards):
    return FLEET.servers[FLEET.names.index(wildcards.replica)]


def replica_params(*keys):
    """An input function: these keys of the replica's section, recorded as params (rerun triggers)."""

    def get(wildcards):
        return as_params(get_replica(wildcards).settings, *keys)

    return get


def get_replica_runtime(wildcards):
    """The replica's whole section as run-time values (not recorded: see runtime_only)."""
    return runtime_only(server=as_params(get_replica(wildcards).settings))


def get_replica_state_dir(wildcards):
    return get_replica(wildcards).state_dir


def get_replica_unit_file_input(wildcards):
    """A local replica's unit file (as get_unit_file_input for the primary)."""
    unit_file = get_replica(wildcards).settings.local_unit_file
    return [unit_file] if unit_file else []


def get_replica_files(pattern):
    """An input function: `pattern` for every replica ([] without replicas: no new input)."""
    files = [pattern.format(replica=name) for name in REPLICAS]

    def get_files(wildcards):
        return files

    return get_files


def get_server_resources():
    """generate_shard's resources: vllm_NAME = 1 for the server shard k is sent to (k mod n), 0 for
    the others. Resources are no rerun trigger: moving a shard to another replica reruns nothing.
    """

    def one(name):
        def get(wildcards):
            return int(assigned_server(int(wildcards.shard), FLEET.names) == name)

        return get

    return {resource_name(name): one(name) for name in FLEET.names}
