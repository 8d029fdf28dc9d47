"""An extraction engine scope's allocation on a cluster: what the group of rule serve_extraction_engine
(the engine and the extraction clients of its scope: one sbatch under profiles/slurm) asks for, from the
workflow profile and the plan. The rules (rules/common/engine.smk) and `make cost` compute it alike.

Snakemake sums the resources of a group's jobs that run at once (snakemake.resources.GroupResources:
integers summed within a level of the group's DAG, runtime the longest; a string resource the same in
every job that has it), and every job of a scope runs at once: Snakemake starts them together. So each
job declares what it holds:

- each client (extract_hidden_states: the profile's `mem_mb`) its floor, from its start to its end: the
  Snakemake job process that runs it and its own, holding its shard's plan while it waits for the
  engine (benchmarks/client_memory.py). Summed over the clients that run: every shard of the scope in
  a fresh run, one for a shard forced again;
- the engine its own (the profile's `engine_mem_mb`, `engine_cpus`) plus the clients' work: a client in
  one of the engine's hidden_states.vllm.max_clients slots only waits for the engine; the work is
  packing, by at most hidden_states.pack_slots clients at once (packing.pack_slot), each holding one
  sample's auxiliary rows and one part written before its fsync, on one CPU (OMP_NUM_THREADS=1);
- its time: the scope's tokens at hidden_states.vllm.expected_tokens_per_s plus one engine start
  (expected_start_s), times TIME_HEADROOM, unless the profile gives the engine a `runtime`; a client asks
  for its engine's (a group takes the longest of its jobs).

A profile names the GPUs in one of two forms, once in its default-resources (`gpus_as`): `gpus` (the
plugin's `gpu` resource: --gpus=N) or `gres` (a `gres: gpu:N` resource: --gres=gpu:N, for a site
without --gpus); the CPUs are --cpus-per-task in both (SLURM gives --gres=gpu:N one CPU when nothing
else asks for more, and refuses --gres=gpu:8 beside --gpus=1).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline import state_bytes
from eagle3_pipeline.launch import job_gpus
from eagle3_pipeline.planning import disk_cap
from eagle3_pipeline.settings import Settings

GPU_FORMS = ("gpus", "gres")
PACK_CPUS = 1  # a packing client: one thread (its OMP_NUM_THREADS=1, scripts/extract_hidden_states.py)
TIME_HEADROOM = 1.5  # the time limit over the planned time: a slower engine than assumed still ends
MIB = 2**20  # SLURM's --mem counts MiB (Snakemake's mem_mb goes there as it is)
ENGINE_RULES = ("serve_extraction_engine", "baseline_serve_extraction_engine")
CLIENT_RULES = ("extract_hidden_states", "baseline_extract_hidden_states")


class AllocationError(ValueError):
    """A profile's resources that cannot size the allocation; the message names the key."""


def plain(value: Any) -> Any:
    """A resource value as a plain int or str: a profile's YAML value, or Snakemake's Resource (a string
    is kept unevaluated by Snakemake: its raw text, a quoted one unquoted)."""
    evaluable = getattr(value, "is_evaluable", None)
    if evaluable is None:
        return value
    if not evaluable():
        return value.value
    raw = str(value.raw)
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def plain_resources(resources: Mapping[str, Any] | None) -> dict[str, Any]:
    return {name: plain(value) for name, value in (resources or {}).items()}


def gpu_form(defaults: Mapping[str, Any]) -> str:
    """The profile's form for GPUs (its default-resources' `gpus_as`; `gpus` without one).

    Raises:
        AllocationError: another form.
    """
    form = plain(defaults.get("gpus_as", "gpus"))
    if form not in GPU_FORMS:
        raise AllocationError(f"default-resources gpus_as: {form!r} must be one of {GPU_FORMS}")
    return str(form)


def gpu_request(form: str, count: int) -> dict[str, int | str]:
    """A rule's own request of `count` GPUs in the profile's form (a profile's set-resources for the rule,
    in the same form, replaces it); none for no GPU."""
    if count <= 0:
        return {}
    return {"gpu": count} if form == "gpus" else {"gres": f"gpu:{count}"}


def gpu_count(resources: Mapping[str, Any]) -> int | None:
    """The GPUs a profile's resources for a rule ask for (launch.job_gpus); None for none."""
    return job_gpus(plain_resources(resources)) or None


def _integer(resources: Mapping[str, Any], name: str, rule: str) -> int | None:
    value = plain(resources.get(name))
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AllocationError(f"set-resources {rule}: {name}: {value!r} must be a whole number")
    return value


def packing_bytes(settings: Settings, hidden_size: int) -> int:
    """What one packing client holds beyond its floor: the auxiliary rows of its longest sample (read
    from a part, then written into the shard) and one part written before its fsync."""
    hs = settings.hidden_states
    rows = hs.max_seq_len * (state_bytes.STATE_COUNT - 1) * hidden_size * state_bytes.DTYPE_BYTES[hs.dtype]
    return rows + disk_cap.part_bound_bytes(settings, hidden_size)


@dataclass(frozen=True)
class EngineAllocation:
    """One engine scope's allocation: the engine job's own resources (`mem_mb`, `cpus` with its clients'
    work; None where the profile sizes nothing) and what each client adds (`client_mem_mb`)."""

    gpus: int | None
    mem_mb: int | None
    cpus: int | None
    runtime: int  # minutes
    client_mem_mb: int | None

    def group_mem_mb(self, clients: int) -> int | None:
        """The group's memory, as Snakemake sums it: the engine job's and each of `clients` clients'."""
        if self.mem_mb is None:
            return None
        return self.mem_mb + clients * (self.client_mem_mb or 0)


def engine_mem_mb(
    engine: Mapping[str, Any], settings: Settings, hidden_size: int | None, rule: str
) -> int | None:
    """The engine job's memory: the profile's `mem_mb` for it as given, else its `engine_mem_mb` plus
    the packing clients' (pack_slots x packing_bytes); None when the profile gives neither.

    Raises:
        AllocationError: a value that is not a whole number, or no hidden size to size the packing.
    """
    explicit = _integer(engine, "mem_mb", rule)
    if explicit is not None:
        return explicit
    own = _integer(engine, "engine_mem_mb", rule)
    if own is None:
        return None
    if hidden_size is None:
        raise AllocationError(
            f"set-resources {rule}: engine_mem_mb needs the target's hidden size (its config.json, or "
            "target.hidden_size) to add the packing clients' memory; or give mem_mb, the whole"
        )
    return own + settings.hidden_states.pack_slots * math.ceil(packing_bytes(settings, hidden_size) / MIB)


def engine_cpus(engine: Mapping[str, Any], settings: Settings, rule: str) -> int | None:
    """The engine job's CPUs: the profile's `cpus_per_task` for it as given, else its `engine_cpus` plus
    one for each client that may pack at once; None when the profile gives neither."""
    explicit = _integer(engine, "cpus_per_task", rule)
    if explicit is not None:
        return explicit
    own = _integer(engine, "engine_cpus", rule)
    return None if own is None else own + settings.hidden_states.pack_slots * PACK_CPUS


def planned_seconds(settings: Settings, tokens: int) -> float:
    """One engine start and `tokens` at the expected throughput (hidden_states.vllm)."""
    vllm = settings.hidden_states.vllm
    return vllm.expected_start_s + tokens / vllm.expected_tokens_per_s


def time_limit(
    settings: Settings, tokens: int, engine: Mapping[str, Any] | None = None, rule: str = ""
) -> int:
    """An engine scope's time limit in minutes: the profile's `runtime` for the engine as given, else
    the planned time of its `tokens` times TIME_HEADROOM."""
    explicit = _integer(engine or {}, "runtime", rule)
    if explicit is not None:
        return explicit
    return math.ceil(TIME_HEADROOM * planned_seconds(settings, tokens) / 60)


def allocation(
    settings: Settings,
    tokens: int,
    hidden_size: int | None,
    engine: Mapping[str, Any],
    client: Mapping[str, Any],
    rule: str = ENGINE_RULES[0],
) -> EngineAllocation:
    """The allocation of an engine scope of `tokens` from the profile's set-resources of the engine's
    rule (`engine`) and of its clients' (`client`), as plain values."""
    return EngineAllocation(
        gpus=gpu_count(engine),
        mem_mb=engine_mem_mb(engine, settings, hidden_size, rule),
        cpus=engine_cpus(engine, settings, rule),
        runtime=time_limit(settings, tokens, engine, rule),
        client_mem_mb=_integer(client, "mem_mb", CLIENT_RULES[0]),
    )


def shard_tokens(
    settings: Settings,
    shards: Sequence[str],
    hidden_size: int | None = None,
    results: str | Path | None = None,
) -> dict[str, int]:
    """Each shard's tokens as the workflow plans them: its checked traces' (its check_disk_budget record
    under `results`, the run's folder, up to date: disk_cap.traced_states) where there is one and the
    hidden size is known, else its bound (shard_size x max_seq_len, as disk_cap.shard_bound_bytes)."""
    hs = settings.hidden_states
    bound = settings.dataset.shard_size * hs.max_seq_len
    tokens = dict.fromkeys(shards, bound)
    if results is not None and hidden_size is not None:
        per_token = state_bytes.bytes_per_token(hidden_size, hs.dtype)
        traced = disk_cap.traced_states(results, shards, disk_cap.records_sizing(settings, hidden_size))
        tokens.update({shard: states // per_token for shard, states in traced.items()})
    return tokens
