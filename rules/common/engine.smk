# The vllm backend's extraction engine: its folder per scope (eagle3_pipeline.planning.engines), its
# run-time keys, and which extraction jobs consume its Snakemake job.
import functools
import sys
from pathlib import Path

from eagle3_pipeline.planning.disk_cap import parse_time_hidden_size
from eagle3_pipeline.hidden_states.allocation import (
    CLIENT_RULES,
    ENGINE_RULES,
    engine_cpus,
    engine_mem_mb,
    shard_tokens,
    time_limit,
)
from eagle3_pipeline.hidden_states.engine import stop_all
from eagle3_pipeline.hidden_states.engine_job import job_text
from eagle3_pipeline.planning.engines import SERVICE, EngineScopes
from eagle3_pipeline.settings import RuntimeWord, runtime_only, runtime_params
from snakemake_interface_executor_plugins.settings import DeploymentMethod

# The interpreter of the engine job's own environment, as Snakemake picks one for a script: (snakemake
# 9's PythonScript.execute_script): under --use-conda, the `python` of the rule's conda environment,
# which is on the job's PATH; else the interpreter that reads this Snakefile.
JOB_PYTHON = RuntimeWord(
    "python"
    if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
    else sys.executable
)

# The vllm backend's extraction engine (hidden_states/engine.py) is a job of its own: rule
# serve_extraction_engine, whose service() output its extraction jobs consume. Snakemake runs the
# engine and its consumers as one group (one submission on one node on a cluster), all at once, and
# terminates the engine once they are done: training, after them, finds the GPUs free. One engine
# per scope: the main shards, or under a cap one epoch's plan window; the baseline's have their own.
VLLM_ENGINE = SETTINGS.hidden_states.backend == "vllm"
ENGINES = EngineScopes(RESULTS, WORK, LOGS, windowed=bool(WINDOW))
ENGINE_ROOT = ENGINES.root
# the folder of the main shards' engine, or with {epoch} and {window} of a plan window's
ENGINE_DIR = ENGINES.pattern
ENGINE_SCOPE = ENGINES.scope(ENGINE_DIR)  # its logs' names
ENGINE_SERVICE = SERVICE  # the engine job's service() output, in its folder
# the baseline's extraction engine (its own scope: nothing of the main draft waits on it)
BASELINE_ENGINE_DIR = ENGINES.baseline
# every engine folder of the run: a GPU job waits there for a stopping engine's exit (engine.wait_gone)
ENGINE_ROOTS = ENGINES.roots if VLLM_ENGINE else []
# where a run keeps each engine start's stats (engine.write_record): the engine folder's path under
# results/RUN/ with engine_stats for engine (hidden_states/engine_stats[/epoch-E-window-W],
# baseline/hidden_states/engine_stats); the report's table of engine starts reads them
ENGINE_STATS_ROOTS = ENGINES.stats_roots
if VLLM_ENGINE and "extraction_engines" not in workflow.global_resources:
    # engines at once: one (two never hold the GPUs together; the serve check holds it too)
    workflow.global_resources["extraction_engines"] = 1


def engine_dir(epoch=None, shard=None):
    """The extraction engine folder of shard `shard` (of epoch `epoch` under a cap)."""
    return ENGINES.folder(epoch, TRAINING.window_of(epoch, shard) if WINDOW else None)


# The pack slots' folders (hidden_states.pack_slots, packing.pack_slot): one for the run's extraction
# jobs (under a cap its windows are extracted one after another), one for the baseline's
PACK_DIR = f"{WORK}/hidden_states/pack_slots"
BASELINE_PACK_DIR = f"{WORK}/{BASELINE}hidden_states/pack_slots"


def engine_runtime(where, pack_dir=PACK_DIR):
    """An extraction job's run-time values (not recorded: see runtime_only): the hidden_states.* it does
    not record (device_map, recorded through launch_mode; max_disk_gb, pack_slots; hidden_states.vllm's
    memory, graphs, connector, interpreter and pacing: vllm_backend.RUNTIME_KEYS, also out of the parts'
    key), the engine's folder and its log, and the folder of the pack slots (both backends).
    """
    return runtime_only(
        hidden_states=runtime_params(SETTINGS.hidden_states, "extract_hidden_states"),
        engine={
            "dir": where,
            "log": ENGINES.log(where) if where else None,
        },
        packing={"dir": pack_dir},
    )


def shard_engine(wildcards):
    """The engine folder of a main extraction job's scope (vllm backend only, else None)."""
    if not VLLM_ENGINE:
        return None
    epoch = wildcards.get("epoch")
    return engine_dir(epoch, wildcards.shard)


def baseline_shard_engine(wildcards):
    """shard_engine for a baseline extraction job (its own scope)."""
    return BASELINE_ENGINE_DIR if VLLM_ENGINE else None


def engine_input(folder):
    """A vllm extraction job's `engine` input: its scope's service() output, ancient, made to exist when
    Snakemake plans (EngineScopes.planned_service). Every extraction job consumes it, so each one that
    runs, for whatever reason (an output missing, a changed param or script, --forcerun, a retry), is
    planned in its scope's engine group (the engine's GPUs, locally and on a cluster), and a done one
    is not rerun when the engine job runs. The transformers backend: none."""
    if folder is None:
        return []
    return [ancient(service(ENGINES.planned_service(folder)))]


def get_engine_service(wildcards):
    return engine_input(shard_engine(wildcards))


def get_baseline_engine_service(wildcards):
    return engine_input(baseline_shard_engine(wildcards))


def get_engine_runtime(wildcards):
    return engine_runtime(shard_engine(wildcards))


def get_baseline_engine_runtime(wildcards):
    return engine_runtime(baseline_shard_engine(wildcards), BASELINE_PACK_DIR)


def engine_job(where):
    """serve_extraction_engine's params.job (engine_job.job_text): the whole hidden_states section (its
    clients' settings, which they check), its folder, its engine's log, its service() output and the
    results folder of its stats. Not recorded (RuntimeWord): the engine job never reruns by itself,
    only with the extraction jobs it serves, whose params record the settings the states depend on.
    """
    return RuntimeWord(
        job_text(
            SETTINGS.hidden_states,
            where,
            ENGINES.log(where),
            ENGINES.service(where),
            ENGINES.stats_dir(where),
        )
    )


def get_engine_job(wildcards):
    return engine_job(ENGINES.folder(wildcards.get("epoch"), wildcards.get("window")))


def get_baseline_engine_job(wildcards):
    return engine_job(BASELINE_ENGINE_DIR)


def get_engine_gpus(wildcards):
    """The engine job's GPUs: locally every one of the run (--resources gpu=N: vLLM spreads the target
    over the visible GPUs); on a cluster the profile's set-resources (profiles/slurm: 8), else its
    tensor parallel size.
    """
    limit = resource_limit("gpu")
    return (
        limit
        if isinstance(limit, int)
        else SETTINGS.hidden_states.vllm.tensor_parallel_size or 1
    )


def get_engine_gres(wildcards):
    return f"gpu:{get_engine_gpus(wildcards)}"


def engine_gpu_request():
    """The engine job's GPUs in the profile's form (GPU_FORM: gpu, or a gres of GPUs)."""
    return {"gpu": get_engine_gpus} if GPU_FORM == "gpus" else {"gres": get_engine_gres}


# The allocation of an engine scope on a cluster (hidden_states/allocation.py): the engine job asks for
# its own memory and CPUs plus what its clients' packing takes (the profile's engine_mem_mb and
# engine_cpus), each client for its floor (the profile's mem_mb: Snakemake sums the group), and both
# for the scope's time limit from the plan (its tokens at hidden_states.vllm.expected_tokens_per_s and
# one engine start, with headroom) unless the profile gives the engine a runtime.
ENGINE_OF = {client: engine for client, engine in zip(CLIENT_RULES, ENGINE_RULES)}


@functools.cache
def allocation_hidden_size():
    """The target's hidden size for the allocation (budget.parse_time_hidden_size); None where none is
    known on this machine (no config.json, no target.hidden_size): the time limits then plan every
    shard at its bound, and a profile's engine_mem_mb is refused (allocation.engine_mem_mb says why).
    """
    hidden = SETTINGS.target.hidden_size
    where = Path(SETTINGS.target.model) / "config.json"
    if not (hidden or SETTINGS.demo.enabled or where.exists()):
        return None
    return parse_time_hidden_size(SETTINGS, "the extraction engine's allocation")


@functools.cache
def planned_shard_tokens():
    """Each shard's tokens as the plan counts them: its checked traces', else its bound."""
    return shard_tokens(SETTINGS, SHARDS, allocation_hidden_size(), RESULTS)


def scope_tokens(name, epoch=None, window=None):
    """The tokens of the scope of the engine named `name` (its rule's name): the main shards', one plan
    window's, or the baseline's (every shard at its bound: its traces have no budget records).
    """
    if name == ENGINE_RULES[1]:
        return sum(shard_tokens(SETTINGS, SHARDS).values())
    tokens = planned_shard_tokens()
    shards = EPOCH_WINDOWS[int(epoch)][int(window)] if WINDOW else SHARDS
    return sum(tokens[shard] for shard in shards)


def get_engine_time_limit(wildcards, rulename):
    """An engine job's time limit in minutes (allocation.time_limit)."""
    tokens = scope_tokens(rulename, wildcards.get("epoch"), wildcards.get("window"))
    return time_limit(SETTINGS, tokens, profile_resources(rulename), rulename)


def get_client_time_limit(wildcards, rulename):
    """An extraction client's time limit: its engine's (a group takes the longest of its jobs)."""
    engine = ENGINE_OF[rulename]
    epoch = wildcards.get("epoch")
    window = TRAINING.window_of(epoch, wildcards.shard) if WINDOW else None
    tokens = scope_tokens(engine, epoch, window)
    return time_limit(SETTINGS, tokens, profile_resources(engine), engine)


def get_engine_mem_mb(wildcards, rulename):
    """The engine job's memory: None unless the profile sizes it (allocation.engine_mem_mb)."""
    return engine_mem_mb(
        profile_resources(rulename), SETTINGS, allocation_hidden_size(), rulename
    )


def get_engine_cpus(wildcards, rulename):
    """The engine job's CPUs: None unless the profile sizes them (allocation.engine_cpus)."""
    return engine_cpus(profile_resources(rulename), SETTINGS, rulename)


def engine_resources(name):
    """The resources of the engine named `name` (its rule's name): its GPUs in the profile's form, the
    count of engines at once, its time limit, and its memory and CPUs where the profile gives its own
    (engine_mem_mb, engine_cpus; a sized resource must be a number, so none without them locally).
    """
    profile = profile_resources(name)
    resources = {
        **engine_gpu_request(),
        "extraction_engines": 1,
        "runtime": get_engine_time_limit,
    }
    if "engine_mem_mb" in profile:
        resources["mem_mb"] = get_engine_mem_mb
    if "engine_cpus" in profile:
        resources["cpus_per_task"] = get_engine_cpus
    return resources


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
    """onsuccess/onerror: no extraction engine outlives the snakemake call (a safety net: the engine
    jobs end with their consumers, and an engine dies with its job)."""
    for root in ENGINES.roots:
        if VLLM_ENGINE and Path(root).exists():
            for report in stop_all(Path(root)):
                if report.get("stopped"):
                    print(
                        f"extraction engine {report.get('start_id')}: {report['stopped']}"
                    )
