"""An extraction job: shard k of every split through one load of the target, and its job file.

Rule extract_hidden_states runs a thin script (scripts/extract_hidden_states.py) that builds one
`ShardJob` per split from the rule's inputs and outputs (`rule_jobs`), writes them with the typed
`hidden_states` section as JSON under the shard's work folder (`write_jobs`) and has
eagle3_pipeline.launch exec `accelerate launch -m eagle3_pipeline.hidden_states JOB.json`, which reads
them back (`read_jobs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from eagle3_pipeline import launch
from eagle3_pipeline.settings import HiddenStatesSettings, as_params, section

PATH_FIELDS = (
    "traces",
    "target",
    "output",
    "metadata",
    "work",
    "server_json",
    "engine_dir",
    "engine_log",
    "pack_dir",
)


@dataclass(frozen=True)
class ShardJob:
    """One split of one shard: which traces, through which target, into which files.

    What is extracted and how (layers, dtypes, backend, ...) is the run's `HiddenStatesSettings`,
    shared by every job of a call.
    """

    traces: Path
    shard: int  # the trace rows whose `shard` column equals it
    target: Path  # the target's folder
    output: Path
    metadata: Path
    work: Path  # the resumable parts (parts.py)
    server_json: Path | None = None  # the served unit's snapshot: the vllm backend's engine settings
    # the vllm backend's engine folder, shared by the jobs of one engine (engine.py); None: a private
    # engine for this call, stopped when it returns (tests, benchmarks)
    engine_dir: Path | None = None
    engine_log: Path | None = None  # the engine's own log (None: engine_dir/engine.log)
    # the pack slots' folder, shared by the run's extraction jobs (packing.pack_slot); None: no slot
    pack_dir: Path | None = None


def rule_jobs(
    traces: Sequence[str],
    outputs: Sequence[str],
    metadata: Sequence[str],
    shard: int,
    target_config: str,
    work: str,
    server_json: str | None = None,
    engine_dir: str | None = None,
    engine_log: str | None = None,
    pack_dir: str | None = None,
) -> list[ShardJob]:
    """One job per split, in the order of `traces`; each split's resumable state in WORK/<split>.

    Args:
        traces: traces/shards/{split}/shard-{k}.parquet, one per split.
        outputs: hidden_states/{split}/shard-{k}.safetensors, in the same order.
        metadata: hidden_states/{split}/shard-{k}.json, in the same order.
        shard: k (rows whose `shard` column equals it).
        target_config: The target's config.json (the target is its folder).
        work: The shard's work folder.
        server_json: The served unit's snapshot (the vllm backend's engine settings).
        engine_dir: The vllm backend's shared extraction engine (engine.py); None: a private one.
        engine_log: That engine's log (under logs/); None: engine_dir/engine.log.
        pack_dir: The pack slots' folder of the run's extraction jobs (packing.pack_slot); None: none.

    Raises:
        ValueError: traces, outputs and metadata do not name one path per split each.
    """
    if not len(traces) == len(outputs) == len(metadata):
        raise ValueError(
            f"one output and one metadata file per split: {len(traces)} traces, {len(outputs)} outputs, "
            f"{len(metadata)} metadata files"
        )
    return [
        ShardJob(
            traces=Path(t),
            shard=int(shard),
            target=Path(target_config).parent,
            output=Path(o),
            metadata=Path(m),
            work=Path(work) / Path(o).parent.name,
            server_json=Path(server_json) if server_json else None,
            engine_dir=Path(engine_dir) if engine_dir else None,
            engine_log=Path(engine_log) if engine_log else None,
            pack_dir=Path(pack_dir) if pack_dir else None,
        )
        for t, o, m in zip(traces, outputs, metadata, strict=True)
    ]


def launch_mode(hidden_states: HiddenStatesSettings) -> launch.LaunchMode:
    """How the job's processes start: the vllm backend's one client (its engine holds the GPUs), one
    process spreading the target over the job's GPUs (device_map), else one per GPU."""
    if hidden_states.backend == "vllm":
        return launch.LaunchMode.CLIENT
    return launch.LaunchMode.DEVICE_MAP if hidden_states.device_map else launch.LaunchMode.DDP


def recorded_launch_mode(hidden_states: HiddenStatesSettings) -> str:
    """launch_mode as extract_hidden_states records it (a rerun trigger: the target's placement), in the
    form its first runs recorded: "ddp" for one process per GPU, else "device_map" (the vllm backend's
    client too, which was recorded so before it had a mode of its own)."""
    mode = launch_mode(hidden_states)
    return mode.value if mode is launch.LaunchMode.DDP else launch.LaunchMode.DEVICE_MAP.value


def write_jobs(hidden_states: HiddenStatesSettings, jobs: Sequence[ShardJob], path: str | Path) -> Path:
    """The jobs of one shard and the settings they run with as a job file (JSON) at `path`."""
    data = {"hidden_states": as_params(hidden_states), "jobs": [asdict(job) for job in jobs]}
    return launch.write_job(data, path)


def read_jobs(path: str | Path) -> tuple[HiddenStatesSettings, list[ShardJob]]:
    """The settings and jobs a job file holds (`write_jobs`).

    Raises:
        ValueError: the file is not an extraction job file (no jobs, or a key missing or unknown).
    """
    data = launch.read_job(path)
    if not isinstance(data.get("jobs"), list) or not data["jobs"]:
        raise ValueError(f"{path} is not an extraction job file: no list of jobs")
    jobs = [_job(job, path) for job in data["jobs"]]
    try:
        hidden_states = section(HiddenStatesSettings, data.get("hidden_states"))
    except TypeError as err:  # a key the schema does not know
        raise ValueError(f"{path} is not an extraction job file: hidden_states: {err}") from err
    return hidden_states, jobs


def _job(job: dict[str, Any], path: str | Path) -> ShardJob:
    unknown = set(job) - {f.name for f in fields(ShardJob)}
    if unknown:
        raise ValueError(f"{path} is not an extraction job file: unknown keys {sorted(unknown)}")
    paths = {k: Path(v) for k, v in job.items() if k in PATH_FIELDS and v is not None}
    try:
        return ShardJob(**(job | paths))
    except TypeError as err:  # a required key missing
        raise ValueError(f"{path} is not an extraction job file: {err}") from err
