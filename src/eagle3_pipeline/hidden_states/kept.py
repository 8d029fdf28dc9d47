"""Finished shards kept beside their engine until its group is done: nothing finished is lost when
another job of the group fails.

The vllm backend's extraction jobs and their engine job are one Snakemake group, and when one job of
a group fails Snakemake deletes the outputs of every job of it, the shards finished seconds earlier
included, and `retries` reruns the whole group (Snakemake 9.27.1: jobs.py, GroupJob.postprocess calls
each job's cleanup). So each client, once it has committed a shard, keeps a hard link of its states
and metadata in its engine's folder (`kept/`: no second copy on disk) with the fingerprint of the plan
that made them (parts.fingerprint). A rerun client takes a kept shard of the same plan back into its
outputs instead of extracting it again (`restore`): the same file, its bytes and mtime untouched.

The engine job drops the kept links when Snakemake ends it after every client is done (`release`),
and only if no client that joined this engine start is unfinished (`clients/START_ID/`, one record
per client from its join to its last commit): SLURM's preemption or scancel sends the same SIGTERM to
the engine while clients still run, and a failed group's engine is killed outright (SIGKILL), so the
links stay for the rerun. Under hidden_states.max_disk_gb a window's links are gone once its group is
done, before its states are trained on and deleted: the cap counts every shard once.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
from pathlib import Path
from typing import Any

from eagle3_pipeline import io
from eagle3_pipeline.hidden_states.job import ShardJob

log = logging.getLogger(__name__)
KEPT_DIR = "kept"
CLIENTS_DIR = "clients"


def _entry(engine_dir: Path, job: ShardJob) -> Path:
    """The kept entry's stem for `job`'s output: its split and file name (unique within a scope)."""
    return Path(engine_dir) / KEPT_DIR / f"{job.output.parent.name}-{job.output.stem}"


def _link(source: Path, destination: Path) -> None:
    """`destination` made a hard link of `source` (replacing whatever it was)."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    tmp = destination.with_name(destination.name + ".link")
    tmp.unlink(missing_ok=True)
    os.link(source, tmp)
    os.replace(tmp, destination)


def keep(engine_dir: Path, job: ShardJob, key: str) -> None:
    """Keep `job`'s committed states and metadata (hard links) with the plan fingerprint `key`; the
    record last, so an entry without it is never restored."""
    entry = _entry(engine_dir, job)
    _link(job.output, entry.with_suffix(".safetensors"))
    _link(job.metadata, entry.with_suffix(".json"))
    record = {"fingerprint": key, "output": str(job.output), "metadata": str(job.metadata)}
    io.write_json(record, entry.with_suffix(".key"))


def restore(engine_dir: Path, job: ShardJob, key: str) -> dict[str, Any] | None:
    """`job`'s kept shard back into its outputs when the same plan (`key`) made it; its metadata, or None
    (nothing kept, or kept by another plan: that entry is dropped, the shard is extracted again)."""
    entry = _entry(engine_dir, job)
    states, metadata, record_file = (entry.with_suffix(s) for s in (".safetensors", ".json", ".key"))
    try:
        record = json.loads(record_file.read_text())
    except (OSError, ValueError):
        return None
    if record.get("fingerprint") != key or not (states.exists() and metadata.exists()):
        for path in (record_file, states, metadata):
            path.unlink(missing_ok=True)
        return None
    _link(states, job.output)
    _link(metadata, job.metadata)
    log.info("%s: taken back from %s (finished before its group failed)", job.output, states)
    return json.loads(metadata.read_text())


def _client_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def joined(engine_dir: Path, start_id: str) -> None:
    """Record that this client joined engine start `start_id` and has shards still to commit."""
    io.write_text("", Path(engine_dir) / CLIENTS_DIR / start_id / _client_name())


def finished(engine_dir: Path) -> None:
    """This client committed (and kept) every shard it extracts: its join records go."""
    for record in (Path(engine_dir) / CLIENTS_DIR).glob(f"*/{_client_name()}"):
        record.unlink(missing_ok=True)


def unfinished(engine_dir: Path, start_id: str) -> list[str]:
    """The clients of engine start `start_id` that joined it and have not finished."""
    folder = Path(engine_dir) / CLIENTS_DIR / start_id
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def release(engine_dir: Path, start_id: str) -> bool:
    """Drop the kept links of `engine_dir` once engine start `start_id` served every client to the end
    (the engine job's end by Snakemake); True when they were dropped."""
    if waiting := unfinished(engine_dir, start_id):
        log.info("kept shards stay: clients %s of engine %s did not finish", ", ".join(waiting), start_id)
        return False
    for folder in (KEPT_DIR, CLIENTS_DIR):
        shutil.rmtree(Path(engine_dir) / folder, ignore_errors=True)
    return True
