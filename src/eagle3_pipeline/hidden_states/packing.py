"""The packed shard: the saved parts moved into one file in trace-row order under the work folder, one
part at a time (each deleted once written: the shard is on disk once), validated, then renamed into
its output with its metadata as the JSON sibling once every split is packed. Both backends pack alike,
each shard in one of the run's hidden_states.pack_slots (pack_slot): at most that many shards have a
part in flight at once, which is what planning/window_plan.py reserves under
hidden_states.max_disk_gb."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from eagle3_pipeline import io
from eagle3_pipeline.hidden_states import capture, storage
from eagle3_pipeline.hidden_states.job import ShardJob
from eagle3_pipeline.hidden_states.parts import packed_mark, part_path
from eagle3_pipeline.hidden_states.plan import ShardPlan
from eagle3_pipeline.hidden_states.sequences import TrainingSequence
from eagle3_pipeline.locks import SlotLockError, held_slot
from eagle3_pipeline.settings import HiddenStatesSettings
from eagle3_pipeline.target_shape import vllm_layer_ids

log = logging.getLogger(__name__)
PACK_POLL_S = 0.1  # how often a job waiting for a pack slot tries again


class PackSlotError(RuntimeError):
    """The pack slots' folder cannot be locked (a filesystem without flock)."""


@contextlib.contextmanager
def pack_slot(folder: Path | None, slots: int) -> Iterator[int | None]:
    """One of `slots` places to pack a shard, held while the block runs: the run's extraction jobs
    (every one of an engine scope started at once under vllm; as many as hold the GPUs under
    transformers, any number on a cluster) share `folder` (rule extract_hidden_states' runtime:
    work/hidden_states/pack_slots), so at most `slots` shards have a part in flight beside their
    states, as planning.window_plan.pack_reserve counts. A lock file per slot (flock: released when the
    process exits, however it exits). `folder` None (tests, benchmarks): no slot, the block runs at once.

    Raises:
        PackSlotError: the folder's filesystem refuses flock (on a cluster, one without locks across
            nodes); the message names the folder and the setting.
    """
    if folder is None:
        yield None
        return
    started = time.monotonic()
    try:
        with held_slot(Path(folder), slots, PACK_POLL_S) as slot:
            if (waited := time.monotonic() - started) >= 1:
                log.info("pack slot %d of %d after %.1f s waiting", slot, slots, waited)
            yield slot
    except SlotLockError as err:
        raise PackSlotError(
            f"{folder}: cannot lock a pack slot ({err}): the results filesystem must support flock "
            "(hidden_states.pack_slots; on Lustre mount with -o flock)"
        ) from err


def token_counts(seqs: list[TrainingSequence]) -> dict[str, int]:
    """Loss-masked token frequencies (for the draft vocabulary map), keys as strings, sorted by id."""
    counts = Counter(t for seq in seqs for t, m in zip(seq.input_ids, seq.loss_mask, strict=True) if m)
    return {str(t): counts[t] for t in sorted(counts)}


def shard_metadata(
    hidden_states: HiddenStatesSettings, plan: ShardPlan, backend: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The shard's metadata (the JSON sibling; all but token_counts also in the safetensors header).

    `backend` holds the vllm backend's keys (`compute_dtype`, `engine`, `final_state_source`); the
    transformers backend's are filled in here.
    """
    seqs, stats, info, layers = plan.seqs, plan.stats, plan.info, plan.layers
    itemsize = storage.TORCH_DTYPES[hidden_states.dtype].itemsize
    backend = backend or {
        "compute_dtype": str(capture.resolve_compute_dtype(hidden_states.compute_dtype)).removeprefix(
            "torch."
        ),
        "final_state_source": "transformers decoder stack's last_hidden_state (after its final norm)",
    }
    return {
        "backend": hidden_states.backend,
        "ids": [s.id for s in seqs],
        "num_samples": len(seqs),
        "num_tokens": sum(len(s) for s in seqs),
        "num_loss_tokens": sum(sum(s.loss_mask) for s in seqs),
        "hidden_size": info.hidden_size,
        "num_hidden_layers": info.num_layers,
        "vocab_size": info.vocab_size,
        "aux_layers": layers,
        "aux_layers_vllm": vllm_layer_ids(layers),
        "layer_numbering": "aux_layers: 0-indexed decoder-layer outputs (HF hidden_states[l+1]); "
        "aux_layers_vllm: vLLM eagle_aux_hidden_state_layer_ids (l+1)",
        "final_state": "post_norm",
        "final_rows": "all",
        "dtype": hidden_states.dtype,
        **backend,
        "target": str(plan.job.target),
        "token_counts": token_counts(seqs),
        "rows": stats.rows,
        "skipped_status": stats.skipped_status,
        "rebuilt_from_template": stats.rebuilt_from_template,
        "overlong": {
            "policy": hidden_states.overlong,
            "max_seq_len": hidden_states.max_seq_len,
            "truncated": stats.truncated,
            "dropped": stats.dropped,
            "dropped_ids": stats.dropped_ids,
        },
        "floor_bytes_per_token": 4 * info.hidden_size * itemsize,
    }


def write_shard(hidden_states: HiddenStatesSettings, plan: ShardPlan, meta: dict[str, Any]) -> Path:
    """Move the parts into the packed shard under the work folder, part by part (each deleted once its
    rows are written and synced), then validate it; returns the packed file, not yet committed.

    The shard is on disk once while it is packed (plus the part being moved), never as every part plus
    a full copy (planning/window_plan.py counts it so). A job that dies while packing resumes from the
    parts left.
    """
    job, seqs = plan.job, plan.seqs
    parts = job.work / "parts"
    path = packed_path(job)
    starts = [0]
    for seq in seqs:
        starts.append(starts[-1] + len(seq))
    resume = any(packed_mark(parts, b).exists() for b in range(len(plan.batches)))
    encoded = storage.encode_metadata(meta)
    dtype = storage.TORCH_DTYPES[hidden_states.dtype]
    shard = storage.PackedShardFile(path, [len(s) for s in seqs], meta["hidden_size"], dtype, encoded, resume)
    try:
        for b, batch in enumerate(plan.batches):
            _move_part(shard, parts, b, batch, seqs, starts)
        input_ids = torch.tensor([t for s in seqs for t in s.input_ids], dtype=torch.int32)
        shard.close(
            encoded, input_ids, torch.tensor([m for s in seqs for m in s.loss_mask], dtype=torch.uint8)
        )
    finally:
        shard.abandon()
    try:
        storage.validate_shard(path, meta["ids"], [s.input_ids for s in seqs], meta["hidden_size"])
    except storage.ShardError:
        job.output.parent.mkdir(parents=True, exist_ok=True)
        path.rename(job.output.with_name(job.output.name + ".invalid"))
        raise
    meta["bytes_per_token"] = path.stat().st_size / meta["num_tokens"] if meta["num_tokens"] else None
    return path


def packed_path(job: ShardJob) -> Path:
    """The shard being packed, in the work folder (Snakemake deletes a failed job's outputs, not this)."""
    return job.work / "packed.safetensors"


def _move_part(
    shard: storage.PackedShardFile,
    parts: Path,
    b: int,
    batch: list[int],
    seqs: list[TrainingSequence],
    starts: list[int],
) -> None:
    """Part b's rows into the shard at their samples' places, synced, then the part deleted."""
    part, mark = part_path(parts, b), packed_mark(parts, b)
    if not mark.exists():
        with safe_open(str(part), framework="pt") as saved:
            if saved.get_tensor("index").tolist() != batch:
                raise storage.ShardError(f"{part}: holds other samples; delete the work folder")
            row = 0
            for i in batch:
                n = len(seqs[i])
                for name in ("aux_hidden_states", "final_hidden_states"):
                    shard.write_rows(name, starts[i], saved.get_slice(name)[row : row + n])
                row += n
        shard.sync()
        io.write_text("", mark)
    part.unlink(missing_ok=True)


def finish_shard(
    hidden_states: HiddenStatesSettings, plan: ShardPlan, backend: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Pack the saved parts into the shard under the work folder and validate it, in one of the
    run's pack slots (pack_slot, in job.pack_dir); returns the metadata.

    Nothing is committed: the caller commits every split's shard (`commit_shard`) once all are packed,
    so that a job dying in its second split keeps the first one's packed file (Snakemake deletes a
    failed job's outputs, never the work folder).
    """
    meta = shard_metadata(hidden_states, plan, backend)
    with pack_slot(plan.job.pack_dir, hidden_states.pack_slots):  # at most pack_slots parts in flight
        write_shard(hidden_states, plan, meta)
    log.info(
        "packed %s: %d samples, %d tokens, %s bytes/token (floor %d)",
        plan.job.output,
        meta["num_samples"],
        meta["num_tokens"],
        meta["bytes_per_token"],
        meta["floor_bytes_per_token"],
    )
    return meta


def commit_shard(job: ShardJob, meta: dict[str, Any], keep_work: bool = False) -> None:
    """The packed shard into its output (a rename: no copy), then its JSON metadata. `keep_work`: a hard
    link instead, the work folder left whole (tests pack it again)."""
    path = packed_path(job)
    job.output.parent.mkdir(parents=True, exist_ok=True)
    if keep_work:
        job.output.unlink(missing_ok=True)
        os.link(path, job.output)
    else:
        try:
            os.replace(path, job.output)
        except OSError as err:
            if err.errno != errno.EXDEV:
                raise
            # work/ on another filesystem than the outputs: a copy, the shard twice until it is done
            log.warning("%s and %s are on different filesystems: copying the shard", path, job.output)
            with io.atomic_path(job.output) as tmp:
                shutil.copyfile(path, tmp)
            path.unlink()
    storage.write_json(meta, job.metadata)
