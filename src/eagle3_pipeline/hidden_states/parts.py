"""The resumable parts of a shard: every batch's states saved under the job's work folder as
`parts/batch-{b:05d}.safetensors` (atomically), so a job that dies redoes only the batches it had not
saved; once moved into the packed shard a part is deleted and `batch-{b:05d}.packed` marks it. The
folder carries a fingerprint of the plan; parts of another plan are never mixed in."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from eagle3_pipeline.hidden_states import storage, vllm_backend
from eagle3_pipeline.hidden_states.plan import ShardPlan
from eagle3_pipeline.settings import HiddenStatesSettings

log = logging.getLogger(__name__)


def fingerprint(
    hidden_states: HiddenStatesSettings, plan: ShardPlan, engine: dict[str, Any] | None = None
) -> str:
    """What the saved parts depend on: the target, layers, dtypes, batch size, the sequences' ids and
    token ids, and (vllm) the backend and the engine settings that change the bytes (never the
    run-time ones: memory, graphs, connector, interpreter; vllm_backend.RUNTIME_KEYS)."""
    digest = hashlib.sha256()
    for seq in plan.seqs:
        digest.update(json.dumps([seq.id, seq.input_ids, seq.loss_mask]).encode())
    key = [str(Path(plan.job.target).resolve()), plan.info.config_sha, plan.layers, hidden_states.dtype]
    key += [hidden_states.compute_dtype, hidden_states.batch_tokens, digest.hexdigest()]
    if hidden_states.backend != "transformers":  # the transformers plan's fingerprint stays as it was
        key += [hidden_states.backend, vllm_backend.bytes_settings(engine or {})]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()


def prepare_work(work: Path, key: str) -> Path:
    """The parts folder for plan `key`, emptied when it holds another plan's parts."""
    plan_file = work / "plan.json"
    if plan_file.exists() and json.loads(plan_file.read_text()).get("fingerprint") != key:
        log.info("work folder %s holds another plan's parts: starting afresh", work)
        shutil.rmtree(work)
    parts = work / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    if not plan_file.exists():
        storage.write_json({"fingerprint": key}, plan_file)
    for stale in parts.glob("*.tmp"):
        stale.unlink()
    return parts


def part_path(parts: Path, batch: int) -> Path:
    return parts / f"batch-{batch:05d}.safetensors"


def packed_mark(parts: Path, batch: int) -> Path:
    """Batch `batch` is in the packed shard (packing.py) and its part deleted."""
    return parts / f"batch-{batch:05d}.packed"


def missing_batches(parts: Path, plan: ShardPlan, rank: int = 0, world: int = 1) -> list[int]:
    """The batches of rank `rank` of `world` that have no saved part yet (nor are packed already)."""
    return [
        b
        for b in range(len(plan.batches))
        if b % world == rank and not part_path(parts, b).exists() and not packed_mark(parts, b).exists()
    ]
