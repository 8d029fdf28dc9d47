"""The packed shard: the saved parts streamed into one file in trace-row order (tmp + rename),
validated, then its metadata written as the JSON sibling. Both backends pack alike."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import torch
from safetensors import safe_open

from eagle3_pipeline.hidden_states import capture, sequences, storage
from eagle3_pipeline.hidden_states.parts import part_path
from eagle3_pipeline.hidden_states.plan import ShardPlan
from eagle3_pipeline.hidden_states.sequences import TrainingSequence
from eagle3_pipeline.settings import HiddenStatesSettings

log = logging.getLogger(__name__)


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
        "aux_layers_vllm": sequences.vllm_layer_ids(layers),
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


def write_shard(hidden_states: HiddenStatesSettings, plan: ShardPlan, meta: dict[str, Any]) -> None:
    """Stream the parts into the packed shard (trace-row order), validate it, then write the JSON."""
    job, seqs, batches = plan.job, plan.seqs, plan.batches
    where: dict[int, tuple[int, int]] = {}  # sample -> (batch, first row in that batch's part)
    for b, batch in enumerate(batches):
        row = 0
        for i in batch:
            where[i] = (b, row)
            row += len(seqs[i])
    parts = {b: safe_open(str(part_path(job.work / "parts", b)), framework="pt") for b in range(len(batches))}
    for b, part in parts.items():
        if part.get_tensor("index").tolist() != batches[b]:
            raise storage.ShardError(f"{job.work}: part {b} holds other samples; delete the work folder")
    lengths = [len(s) for s in seqs]
    dtype = storage.TORCH_DTYPES[hidden_states.dtype]
    writer = storage.PackedShardWriter(
        job.output, lengths, meta["hidden_size"], dtype, storage.encode_metadata(meta)
    )
    try:
        for name in ("aux_hidden_states", "final_hidden_states"):
            for i, n in enumerate(lengths):
                b, row = where[i]
                writer.write(parts[b].get_slice(name)[row : row + n])
        writer.write_offsets()
        writer.write(torch.tensor([t for s in seqs for t in s.input_ids], dtype=torch.int32))
        writer.write(torch.tensor([m for s in seqs for m in s.loss_mask], dtype=torch.uint8))
    except BaseException:
        writer.abort()
        raise
    writer.close()
    try:
        storage.validate_shard(job.output, meta["ids"], [s.input_ids for s in seqs], meta["hidden_size"])
    except storage.ShardError:
        job.output.rename(job.output.with_name(job.output.name + ".invalid"))
        raise
    size = job.output.stat().st_size
    meta["bytes_per_token"] = size / meta["num_tokens"] if meta["num_tokens"] else None
    storage.write_json(meta, job.metadata)


def finish_shard(
    hidden_states: HiddenStatesSettings, plan: ShardPlan, backend: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Pack the saved parts into the shard, validate it, write its JSON; returns the metadata.

    The parts stay: the caller removes the work folders once every shard of its job is written.
    """
    meta = shard_metadata(hidden_states, plan, backend)
    write_shard(hidden_states, plan, meta)
    log.info(
        "wrote %s: %d samples, %d tokens, %s bytes/token (floor %d)",
        plan.job.output,
        meta["num_samples"],
        meta["num_tokens"],
        meta["bytes_per_token"],
        meta["floor_bytes_per_token"],
    )
    return meta
