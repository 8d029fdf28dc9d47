"""What extraction will cost, before it runs: `make cost CONFIG=path [PROFILE=profiles/slurm]`.

Prints one JSON object: the plan's counts (engine starts, extraction passes, tokens, the disk's
high-water mark) and GPU hours between two stated throughput assumptions, for three plans:

- the plan now (`engine_starts_now`, `plan_now`, `plan_now_source`): the one the workflow makes now,
  the engine jobs a dry run's DAG holds (disk_cap.window_plan, as rules/common/windows.smk): each shard
  from its checked traces where they are (its check_disk_budget record under `--results`), the rest at
  their bound ("config", "traces and config", "traces");
- the plan once the traces are checked (`engine_starts`, `extraction_passes`, `tokens`,
  `disk_peak_bytes`, `plan`): the checked shards from their traces (`plan_source` "traces"), the rest at
  the expected length ("traces and expected"; with none checked "expected": every completion
  `--completion-tokens` long, every prompt `--prompt-tokens`, capped at `hidden_states.max_seq_len`);
- the bound (`..._bound`, `plan_bound`): every completion as long as `generation.max_tokens` and every
  shard at its upper bound, what the workflow plans from the config alone (no traces checked).

`plan_basis` says which the plan is, in words. The counts follow the workflow's own rules
(rules/common/windows.smk, rules/hidden_states.smk):

- vllm backend: one engine job (serve_extraction_engine) per run uncapped or when the cap holds every
  shard at once (and one for the baseline's traces, after the main draft's GPU jobs), one per epoch and
  window under `hidden_states.max_disk_gb` otherwise; the same under a cluster profile (`--profile`,
  `make cost PROFILE=profiles/slurm`), where each engine job and its extraction jobs are one
  submission (a Snakemake service group); transformers backend: one target load per extraction job.
- extraction passes: 1 (uncapped, or a cap that holds every shard), else `train.epochs` (each epoch
  extracts every window again).
- tokens: every pass over every sample at the plan's lengths.
- disk_peak_bytes: budget.on_disk_at_once under the plan (a shard counted once, plus a part being
  packed for each of at most hidden_states.pack_slots shards; the training state files), plus the
  engine's staging folder (its tokens in flight).

GPU hours = GPUs x (starts x start time + tokens / prefill throughput): low for the plan with the fast
assumptions, high for the bound with the slow ones. Training is not included; `plan.drafts_trained`
counts the training runs (the main draft and each `validate.learning_curve` point, each at the main
draft's optimizer steps: training's cost scales with it) and `plan.training_jobs` their jobs. A point
extracts nothing of its own, even under a cap (it trains in the main draft's windows); its training
state files are in `disk_peak_bytes` (2 per draft trained, state_files.state_files_at_once).

Under a SLURM profile (vllm backend), `allocations_now` and `allocations` give each engine scope's
sbatch resources as the rules ask for them (hidden_states/allocation.py) and the plugin renders them
(scopes of the same flags together): GPUs, CPUs, the group's memory, the time limit; and the GPU
hours reserved (GPUs x time limit) and planned (at hidden_states.vllm.expected_tokens_per_s and
expected_start_s, the time limit's own plan). `retry` is what resubmitting a failed client's group
costs under the plan: one engine start and the shards not finished (those finished are kept in the
engine's folder and taken back: hidden_states/kept.py), at best the failed shard alone, against the
whole scope again.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline import budget
from eagle3_pipeline.hidden_states import allocation, vllm_backend
from eagle3_pipeline.planning import disk_cap, state_files
from eagle3_pipeline.planning.variants import Variants
from eagle3_pipeline.planning.window_plan import WindowPlan
from eagle3_pipeline.planning.windows import drafts_in_windows
from eagle3_pipeline.settings import Settings
from eagle3_pipeline.state_bytes import bytes_per_token

# Stated assumptions (override on the command line). Kimi-K2.5 on 8 H100/H200, TP 8: prefill of a
# 32 B-active MoE at ~64 GFLOP/token; 20,000 tokens/s is ~25% of the GPUs' dense bf16 peak, 10,000 half
# that. An engine start loads ~600 GB from local NVMe, profiles and warms up: 5 to 10 minutes.
DEFAULT_ASSUMPTIONS = {
    "completion_tokens": 3000,  # mean completion (docs/cluster.md); the bound uses max_tokens
    "prompt_tokens": budget.DEFAULT_PROMPT_TOKENS,
    "tokens_per_s_fast": 20000.0,
    "tokens_per_s_slow": 10000.0,
    "start_s_fast": 300.0,
    "start_s_slow": 600.0,
}


def plan_counts(settings: Settings, plan: WindowPlan | None) -> dict[str, Any]:
    """Shards, windows, passes and engine starts of a config under `plan` (the cap's, None uncapped),
    by the workflow's rules (no DAG built)."""
    from eagle3_pipeline.config import shard_ids

    shards = len(shard_ids(settings.dataset.num_samples, settings.dataset.shard_size))
    windowed = plan is not None and not plan.one_pass
    passes = plan.extraction_passes if plan is not None else 1
    baseline = settings.validate.baseline and plan is None  # refused under a cap
    jobs = shards * passes + (shards if baseline else 0)
    vllm = settings.hidden_states.backend == "vllm"
    scopes = plan.engine_scopes if plan is not None else 1
    starts = scopes + baseline if vllm else jobs
    drafts = state_files.drafts_trained(settings)
    return {
        "shards": shards,
        "one_pass": not windowed,
        "window_shards": plan.largest_window if windowed else None,  # the largest window's
        "windows": scopes if windowed else 0,  # every epoch's
        "extraction_passes": passes,
        "extraction_jobs": jobs,
        "baseline": baseline,
        "engine_starts": starts,
        # the main draft and each validate.learning_curve point, each at the main draft's steps on its
        # states (no extraction of their own; under a cap, each with its state files: disk_peak_bytes)
        "drafts_trained": drafts,
        "learning_curve_points": drafts - 1,
        "training_jobs": _training_jobs(settings, plan, shards) if windowed else drafts,
    }


def _training_jobs(settings: Settings, plan: WindowPlan, shards: int) -> int:
    """Training jobs in windows: every draft's windows of every epoch (a learning-curve point trains
    only in the windows holding its shards), as the rules plan them (planning.windows)."""
    from eagle3_pipeline.config import shard_ids

    ids = shard_ids(settings.dataset.num_samples, settings.dataset.shard_size)
    windows = plan.windows or []
    drafts = drafts_in_windows(windows, Variants.from_settings(settings, ids, ""))
    return sum(d.count(e) for d in drafts.values() for e in range(len(windows)))


def read_profile(profile: str | Path | None) -> dict[str, Any]:
    """A workflow profile's config.yaml (empty without one)."""
    if profile is None:
        return {}
    import yaml

    return yaml.safe_load((Path(profile) / "config.yaml").read_text()) or {}


@dataclass(frozen=True)
class Scope:
    """One engine job's scope: its rule, its shards and their tokens (the largest shard's apart)."""

    rule: str
    shards: int
    tokens: int
    largest_shard_tokens: int


def engine_scopes(
    settings: Settings, plan: WindowPlan | None, shards: Sequence[str], tokens: dict[str, int]
) -> list[Scope]:
    """Each engine job's scope under `plan`, as the rules make them: every shard (uncapped, or one
    pass), else each epoch's windows; and the baseline's (uncapped only), every shard at its bound."""
    windows = (
        [list(shards)] if plan is None or plan.one_pass else [w for ws in plan.windows or [] for w in ws]
    )
    scopes = [
        Scope(allocation.ENGINE_RULES[0], len(w), sum(tokens[k] for k in w), max(tokens[k] for k in w))
        for w in windows
    ]
    if settings.validate.baseline and plan is None:  # refused under a cap
        bound = allocation.shard_tokens(settings, shards)
        scopes.append(
            Scope(allocation.ENGINE_RULES[1], len(shards), sum(bound.values()), max(bound.values()))
        )
    return scopes


def sbatch_flags(resources: dict[str, Any]) -> str:
    """The resource flags snakemake-executor-plugin-slurm renders for a job of these resources (its own
    get_submit_command and set_gres_string, as for the group job Snakemake submits), without the job's
    name, log, comment and folder."""
    from types import SimpleNamespace

    from snakemake.iocontainers import ResourceList
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    job = SimpleNamespace(resources=ResourceList(fromdict=resources), threads=1)
    partition = f"-p {resources['slurm_partition']}" if resources.get("slurm_partition") else ""
    params = {"run_uuid": "R", "slurm_logfile": "L", "comment_str": "C", "account": "", "workdir": ""}
    params["partition"] = partition
    line = get_submit_command(job, params) + set_gres_string(job)
    return " ".join(line.split(" --comment C", 1)[1].split())


def group_resources(
    settings: Settings, hidden_size: int, profile: dict[str, Any], scope: Scope
) -> tuple[dict[str, Any], allocation.EngineAllocation]:
    """The resources Snakemake sums for one scope's group under `profile` (the rules' own, allocation.py):
    the profile's defaults and its engine's, the engine's GPUs in the profile's form, the engine's
    memory with each client's floor, its CPUs and the scope's time limit."""
    defaults = dict(profile.get("default-resources") or {})
    set_resources = profile.get("set-resources") or {}
    engine = dict(set_resources.get(scope.rule) or {})
    client = set_resources.get(allocation.CLIENT_RULES[allocation.ENGINE_RULES.index(scope.rule)]) or {}
    alloc = allocation.allocation(settings, scope.tokens, hidden_size, engine, client, scope.rule)
    own = allocation.gpu_request(
        allocation.gpu_form(defaults), int(settings.hidden_states.vllm.tensor_parallel_size or 1)
    )
    resources = {**defaults, **(own if not {"gpu", "gres"} & set(engine) else {}), **engine}
    computed = {
        "runtime": alloc.runtime,
        "mem_mb": alloc.group_mem_mb(scope.shards),
        "cpus_per_task": alloc.cpus,
    }
    resources |= {k: v for k, v in computed.items() if v is not None}
    return resources, alloc


def scope_allocations(
    settings: Settings, hidden_size: int, profile: dict[str, Any], scopes: list[Scope]
) -> dict[str, Any] | None:
    """What each engine scope's group asks SLURM for under `profile`, its sbatch flags (scopes of the
    same flags together), and GPU hours: reserved (GPUs x time limit) and planned (GPUs x the time the
    limit is planned from: hidden_states.vllm.expected_*). None unless the profile runs on SLURM."""
    if profile.get("executor") != "slurm":
        return None
    lines: dict[str, dict[str, Any]] = {}
    reserved = planned = 0.0
    for scope in scopes:
        resources, alloc = group_resources(settings, hidden_size, profile, scope)
        gpus = allocation.gpu_count(resources) or 0
        flags = sbatch_flags(resources)
        seconds = allocation.planned_seconds(settings, scope.tokens)
        entry = lines.setdefault(flags, {"sbatch": flags, "allocations": 0, "shards": scope.shards})
        entry |= {"gpus": gpus, "time_limit_min": alloc.runtime, "planned_h": round(seconds / 3600, 2)}
        entry["allocations"] += 1
        reserved += gpus * alloc.runtime / 60
        planned += gpus * seconds / 3600
    return {
        "gpus_as": allocation.gpu_form(dict(profile.get("default-resources") or {})),
        "allocations": len(scopes),
        "per_allocation": list(lines.values()),
        "gpu_hours_reserved": round(reserved, 1),
        "gpu_hours_planned": round(planned, 1),
    }


def retry_cost(settings: Settings, scopes: list[Scope], gpus: int, retries: int) -> dict[str, Any]:
    """What resubmitting the largest scope's group after one client failed costs (`retries` times at
    most, the profile's): one engine start and the shards not finished, those finished taken back from
    the engine's folder (hidden_states/kept.py): at best the failed client's shard alone (`kept`); the
    whole scope again had they not been kept (`whole_scope`). GPU hours at hidden_states.vllm.expected_*."""
    largest = max(scopes, key=lambda scope: scope.tokens)

    def hours(tokens: int) -> float:
        return round(gpus * allocation.planned_seconds(settings, tokens) / 3600, 2)

    return {
        "retries": retries,
        "scope_shards": largest.shards,
        "engine_start_gpu_hours": hours(0),
        "kept_gpu_hours": hours(largest.largest_shard_tokens),
        "whole_scope_gpu_hours": hours(largest.tokens),
    }


def _expected_states(settings: Settings, hidden_size: int, per_sample: int) -> dict[str, int]:
    """Each shard's states' bytes with every sample `per_sample` tokens long."""
    from eagle3_pipeline.config import shard_ids

    dataset, hs = settings.dataset, settings.hidden_states
    per_token = bytes_per_token(hidden_size, hs.dtype)
    shards = shard_ids(dataset.num_samples, dataset.shard_size)
    return {
        k: min(dataset.shard_size, dataset.num_samples - i * dataset.shard_size) * per_sample * per_token
        for i, k in enumerate(shards)
    }


def estimate(
    settings: Settings,
    hidden_size: int,
    gpus: int | None = None,
    results: str | Path | None = None,
    profile: dict[str, Any] | None = None,
    **assumptions: float,
) -> dict[str, Any]:
    """The cost JSON (see the module docstring); `results`: the results folder whose run's checked
    traces size the plan (None: the expected-length estimate); `profile`: a workflow profile's
    config.yaml (read_profile), whose SLURM allocations are printed. The plan is the same on every
    executor: the engine is a job of its own, grouped with its extraction jobs, locally and on a
    cluster alike."""
    from eagle3_pipeline.config import shard_ids

    stated = {**DEFAULT_ASSUMPTIONS, **{k: v for k, v in assumptions.items() if v is not None}}
    hs, dataset = settings.hidden_states, settings.dataset
    shards = shard_ids(dataset.num_samples, dataset.shard_size)
    per_token = bytes_per_token(hidden_size, hs.dtype)
    per_sample = int(min(stated["prompt_tokens"] + stated["completion_tokens"], hs.max_seq_len))
    expected_states = _expected_states(settings, hidden_size, per_sample)
    sizing = disk_cap.window_sizing(settings, hidden_size)
    run = Path(results) / settings.run if results is not None else None
    records = disk_cap.records_sizing(settings, hidden_size)
    traced = disk_cap.traced_states(run, shards, records) if run is not None else {}
    if traced:  # once every shard is checked: the checked shards from their traces, the rest expected
        states = {k: traced.get(k, expected_states[k]) for k in shards}
        source = "traces" if len(traced) == len(shards) else "traces and expected"
        basis = (
            f"the traces' real token counts of {len(traced):,} of {len(shards):,} shards (their "
            f"check_disk_budget records under {run / 'budget'})"
            + ("" if source == "traces" else ", the rest at the expected length")
        )
    else:
        states, source = expected_states, "expected"
        basis = (
            f"an estimate: every completion {stated['completion_tokens']:,.0f} tokens and every prompt "
            f"{stated['prompt_tokens']:,.0f} (--completion-tokens, --prompt-tokens), capped at "
            "hidden_states.max_seq_len; the traces' real lengths replace it once they are checked"
        )
    plan = sizing.plan(shards, states, source) if sizing else None
    plan_bound = sizing.plan(shards) if sizing else None
    # what the workflow plans now (rules/common/windows.smk): the checked shards, the rest at the bound
    plan_now = sizing.plan(shards, traced or None) if sizing else None
    counts, counts_bound = plan_counts(settings, plan), plan_counts(settings, plan_bound)
    counts_now = plan_counts(settings, plan_now)
    upper = budget.estimate_from_settings(settings, hidden_size, int(stated["prompt_tokens"]))
    tokens_once = sum(states.values()) // per_token  # one pass over every sample at the plan's lengths
    # the baseline extracts its train split once, beside the main pass
    share = (1 - settings.traces.validation_fraction) if counts["baseline"] else 0.0
    tokens = int(tokens_once * (counts["extraction_passes"] + share))
    tokens_bound = int(upper.tokens * (counts_bound["extraction_passes"] + share))
    corpus = budget.Budget(source, dataset.num_samples, tokens_once, hidden_size, hs.dtype, per_token,
                           tokens_once * per_token)  # fmt: skip
    peak, _ = budget.on_disk_at_once(settings, corpus, plan)
    peak_bound, _ = budget.on_disk_at_once(settings, upper, plan_bound)
    vllm = hs.backend == "vllm"
    if gpus is None:
        gpus = int(hs.vllm.tensor_parallel_size or 1) if vllm else 1
    staging = 0
    if vllm:
        step = hs.vllm.max_num_batched_tokens or max(hs.max_seq_len + 1, hs.batch_tokens)
        in_flight = hs.vllm.max_in_flight_tokens or 2 * step
        # staged states stay in flight until the writer reads them (back-pressure): the staging folder
        # holds at most the engine's tokens in flight
        staging = in_flight * vllm_backend.staging_bytes_per_token(hidden_size)

    def hours(starts: int, tokens: int, per_s: float, start_s: float) -> float:
        return round(gpus * (starts * start_s + tokens / per_s) / 3600, 1)

    # each engine job's scope and, under a SLURM profile, its allocation (vllm backend: the rules'
    # own sizing, allocation.py): the plan now, and once the traces are checked
    now_tokens = allocation.shard_tokens(settings, shards, hidden_size, run)
    scopes_now = engine_scopes(settings, plan_now, shards, now_tokens) if vllm else []
    scopes = (
        engine_scopes(settings, plan, shards, {k: v // per_token for k, v in states.items()}) if vllm else []
    )
    profile = profile or {}
    return {
        "engine_starts_now": counts_now["engine_starts"],
        "plan_now_source": plan_now.source if plan_now is not None else ("traces" if traced else "config"),
        "allocations_now": scope_allocations(settings, hidden_size, profile, scopes_now) if vllm else None,
        "engine_starts": counts["engine_starts"],
        "extraction_passes": counts["extraction_passes"],
        "plan_source": source,
        "plan_basis": basis,
        "allocations": scope_allocations(settings, hidden_size, profile, scopes) if vllm else None,
        "retry": retry_cost(settings, scopes, gpus, int(profile.get("retries") or 0)) if vllm else None,
        "engine_starts_bound": counts_bound["engine_starts"],
        "extraction_passes_bound": counts_bound["extraction_passes"],
        "tokens": tokens,
        "tokens_bound": tokens_bound,
        "disk_peak_bytes": peak + staging,
        "disk_peak_bytes_bound": peak_bound + staging,
        "gpu_hours_low": hours(
            counts["engine_starts"], tokens, stated["tokens_per_s_fast"], stated["start_s_fast"]
        ),
        "gpu_hours_high": hours(
            counts_bound["engine_starts"], tokens_bound, stated["tokens_per_s_slow"], stated["start_s_slow"]
        ),
        "gpus": gpus,
        "backend": hs.backend,
        "plan": counts,
        "plan_now": counts_now,
        "plan_bound": counts_bound,
        "staging_bytes": staging,
        # the learning-curve points' training state files under the cap (in disk_peak_bytes): what the
        # cap must grow by for the plan to stay as it is without them
        "learning_curve_state_bytes": (
            state_files.STATE_FILES_AT_ONCE * counts["learning_curve_points"] * sizing.state_file_bytes
            if sizing
            else 0
        ),
        "hidden_size": hidden_size,
        "assumptions": stated,
    }


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m eagle3_pipeline.hidden_states.cost",
        description="Print the extraction cost of a config as one JSON object (make cost CONFIG=path).",
    )
    parser.add_argument("config", help="the run's config file (e.g. config/examples/kimi-k2.5-8gpu.yaml)")
    parser.add_argument(
        "--hidden-size", type=int, help="the target's, if neither its config.json nor target.hidden_size"
    )
    parser.add_argument(
        "--gpus", type=int, help="GPUs the engine holds (default: hidden_states.vllm.tensor_parallel_size)"
    )
    for name, value in DEFAULT_ASSUMPTIONS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, help=f"default {value:g}")
    parser.add_argument(
        "--profile",
        help="the workflow profile the run uses (e.g. profiles/slurm): its executor, and on SLURM each "
        "engine scope's allocation",
    )
    parser.add_argument(
        "--results", default="results", help="the results folder: its run's checked traces size the plan"
    )
    parser.add_argument("--schema", default=str(budget.REPO_ROOT / "config" / "schema.yaml"))
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    import yaml

    from eagle3_pipeline.config import check_config
    from eagle3_pipeline.settings import build_settings

    args = _parse(sys.argv[1:] if argv is None else argv)
    settings = build_settings(check_config(yaml.safe_load(Path(args.config).read_text()), args.schema))
    hidden_size = budget.cli_hidden_size(settings, args.hidden_size, "the extraction cost")
    assumptions = {name: getattr(args, name) for name in DEFAULT_ASSUMPTIONS}
    profile = read_profile(args.profile)
    result = estimate(settings, hidden_size, args.gpus, args.results, profile, **assumptions)
    result["executor"] = str(profile.get("executor") or "local")  # the same plan: one engine job per scope
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
