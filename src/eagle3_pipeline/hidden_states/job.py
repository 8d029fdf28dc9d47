"""An extraction job: shard k of every split through one load of the target, and its job file.

Rule extract_hidden_states runs a thin script (scripts/extract_hidden_states.py) that builds one
`ExtractSettings` per split from the rule's inputs, params and outputs (`rule_jobs`), writes them as
JSON under the shard's work folder (`write_jobs`) and has eagle3_pipeline.launch exec
`accelerate launch -m eagle3_pipeline.hidden_states JOB.json`, which reads them back (`read_jobs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from eagle3_pipeline import launch
from eagle3_pipeline.hidden_states.extract import ExtractSettings

PATH_FIELDS = ("traces", "target", "output", "metadata", "work", "server_json", "engine_dir", "engine_log")


def rule_jobs(
    traces: Sequence[str],
    outputs: Sequence[str],
    metadata: Sequence[str],
    shard: int,
    target_config: str,
    work: str,
    *,
    layers: str | Sequence[int | str],
    max_seq_len: int,
    overlong: str,
    dtype: str,
    compute_dtype: str,
    batch_tokens: int,
    trust_remote_code: bool,
    backend: str,
    vllm: dict[str, Any] | None,
    server_json: str | None,
    device_map: bool,
    engine_dir: str | None = None,
    engine_log: str | None = None,
) -> list[ExtractSettings]:
    """One job per split, in the order of `traces`; each split's resumable state in WORK/<split>.

    Args:
        traces: traces/shards/{split}/shard-{k}.parquet, one per split.
        outputs: hidden_states/{split}/shard-{k}.safetensors, in the same order.
        metadata: hidden_states/{split}/shard-{k}.json, in the same order.
        shard: k (rows whose `shard` column equals it).
        target_config: The target's config.json (the target is its folder).
        work: The shard's work folder.
        layers: hidden_states.layers ("auto" or three ints).
        max_seq_len: hidden_states.max_seq_len.
        overlong: hidden_states.overlong.
        dtype: hidden_states.dtype (storage).
        compute_dtype: hidden_states.compute_dtype.
        batch_tokens: hidden_states.batch_tokens.
        trust_remote_code: hidden_states.trust_remote_code.
        backend: hidden_states.backend (vllm or transformers).
        vllm: hidden_states.vllm (null values: the snapshot's).
        server_json: The served unit's snapshot (the vllm backend's engine settings).
        device_map: Spread the target over every GPU the process sees (the launcher's device_map mode).
        engine_dir: The vllm backend's shared extraction engine (engine.py); None: a private one.
        engine_log: That engine's log (under logs/); None: engine_dir/engine.log.

    Raises:
        ValueError: traces, outputs and metadata do not name one path per split each.
    """
    if not len(traces) == len(outputs) == len(metadata):
        raise ValueError(
            f"one output and one metadata file per split: {len(traces)} traces, {len(outputs)} outputs, "
            f"{len(metadata)} metadata files"
        )
    shared = ExtractSettings(
        traces=Path(),
        shard=int(shard),
        target=Path(target_config).parent,
        output=Path(),
        metadata=Path(),
        work=Path(work),
        layers=[layers] if isinstance(layers, str) else list(layers),
        max_seq_len=int(max_seq_len),
        overlong=overlong,
        dtype=dtype,
        batch_tokens=int(batch_tokens),
        compute_dtype=compute_dtype,
        device_map=bool(device_map),
        trust_remote_code=bool(trust_remote_code),
        backend=backend,
        vllm=vllm,
        server_json=Path(server_json) if server_json else None,
        engine_dir=Path(engine_dir) if engine_dir else None,
        engine_log=Path(engine_log) if engine_log else None,
    )
    return [
        replace(
            shared, traces=Path(t), output=Path(o), metadata=Path(m), work=Path(work) / Path(o).parent.name
        )
        for t, o, m in zip(traces, outputs, metadata, strict=True)
    ]


def write_jobs(jobs: Sequence[ExtractSettings], path: str | Path) -> Path:
    """The jobs of one shard as a job file (JSON) at `path`."""
    return launch.write_job({"jobs": [asdict(job) for job in jobs]}, path)


def read_jobs(path: str | Path) -> list[ExtractSettings]:
    """The jobs a job file holds (`write_jobs`).

    Raises:
        ValueError: the file is not an extraction job file (no jobs, or a key missing or unknown).
    """
    data = launch.read_job(path)
    if not isinstance(data.get("jobs"), list) or not data["jobs"]:
        raise ValueError(f"{path} is not an extraction job file: no list of jobs")
    return [_settings(job, path) for job in data["jobs"]]


def _settings(job: dict[str, Any], path: str | Path) -> ExtractSettings:
    unknown = set(job) - {f.name for f in fields(ExtractSettings)}
    if unknown:
        raise ValueError(f"{path} is not an extraction job file: unknown keys {sorted(unknown)}")
    paths = {k: Path(v) for k, v in job.items() if k in PATH_FIELDS and v is not None}
    try:
        return ExtractSettings(**(job | paths))
    except TypeError as err:  # a required key missing
        raise ValueError(f"{path} is not an extraction job file: {err}") from err
