# The vllm backend's extraction engine: its folder per scope, its run-time keys, and the order that
# stops it before a GPU job starts.
from pathlib import Path

from eagle3_pipeline.config import SPLITS
from eagle3_pipeline.hidden_states.engine import stop_all
from eagle3_pipeline.hidden_states.vllm_backend import RUNTIME_KEYS
from eagle3_pipeline.settings import as_params, runtime_only

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
# hidden_states.vllm keys that never change a state (memory, graphs, connector, interpreter, pacing):
# run-time only, declared once in the package (vllm_backend.RUNTIME_KEYS, also out of the parts' key)
ENGINE_RUNTIME_KEYS = RUNTIME_KEYS
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


def stop_engines():
    """onsuccess/onerror: no extraction engine outlives the snakemake call that started it."""
    for root in (ENGINE_ROOT, BASELINE_ENGINE_DIR):
        if VLLM_ENGINE and Path(root).exists():
            for report in stop_all(Path(root)):
                if report.get("stopped"):
                    print(
                        f"extraction engine {report.get('start_id')}: {report['stopped']}"
                    )
