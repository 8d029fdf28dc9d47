"""The transformers backend: the target loaded in this process (once per job, for every split), its
batches run here. Under `accelerate launch` with several processes (data parallel: the model fits one
GPU) batch b runs on rank b % world_size; with hidden_states.device_map one process spreads the target
over every visible GPU (a 1T MoE) and the other ranks have nothing to do. Rank 0 waits for every rank
and packs the shard."""

from __future__ import annotations

import logging
import shutil
import time
from typing import Any

import torch

from eagle3_pipeline import io
from eagle3_pipeline.hidden_states import capture, storage
from eagle3_pipeline.hidden_states.job import ShardJob
from eagle3_pipeline.hidden_states.packing import commit_shard, finish_shard
from eagle3_pipeline.hidden_states.parts import fingerprint, missing_batches, part_path, prepare_work
from eagle3_pipeline.hidden_states.plan import ShardPlan, plan_shard
from eagle3_pipeline.hidden_states.sequences import TrainingSequence
from eagle3_pipeline.settings import HiddenStatesSettings

log = logging.getLogger(__name__)


class TargetModel:
    """The target, loaded on first use and then shared by every shard a job extracts."""

    def __init__(self) -> None:
        self._model: torch.nn.Module | None = None

    def get(
        self, hidden_states: HiddenStatesSettings, job: ShardJob, device: torch.device
    ) -> torch.nn.Module:
        if self._model is None:
            compute_dtype = capture.resolve_compute_dtype(hidden_states.compute_dtype)
            device_map = hidden_states.device_map
            log.info(
                "loading %s (%s on %s%s)", job.target, compute_dtype, device, ", device_map=auto" * device_map
            )
            self._model = capture.load_target(
                job.target, compute_dtype, device, device_map, hidden_states.trust_remote_code
            )
        return self._model


def run_batch(
    model: torch.nn.Module,
    seqs: list[TrainingSequence],
    batch: list[int],
    layers: list[int],
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """Capture one batch; its samples' rows concatenated in batch order, with their indices."""
    states = capture.capture_batch(model, [seqs[i].input_ids for i in batch], layers, dtype)
    return {
        "index": torch.tensor(batch, dtype=torch.int64),
        "aux_hidden_states": torch.cat([aux for aux, _ in states]),
        "final_hidden_states": torch.cat([final for _, final in states]),
    }


def run_batches(
    hidden_states: HiddenStatesSettings, plan: ShardPlan, todo: list[int], model: torch.nn.Module
) -> None:
    """Save a part for every batch in `todo`."""
    parts = plan.job.work / "parts"
    storage_dtype = storage.TORCH_DTYPES[hidden_states.dtype]
    for done, b in enumerate(todo, 1):
        start = time.perf_counter()
        tensors = run_batch(model, plan.seqs, plan.batches[b], plan.layers, storage_dtype)
        io.write_safetensors(tensors, part_path(parts, b))
        tokens = tensors["aux_hidden_states"].shape[0]
        rate = tokens / max(time.perf_counter() - start, 1e-9)
        log.info(
            "batch %d (%d/%d): %d samples, %d tokens, %.0f tokens/s",
            b,
            done,
            len(todo),
            len(plan.batches[b]),
            tokens,
            rate,
        )


def extract_shard(
    hidden_states: HiddenStatesSettings, job: ShardJob, state: Any, target: TargetModel
) -> dict[str, Any] | None:
    """One shard's missing batches on this rank, then (rank 0) its packed file in the work folder.

    Returns the metadata on the main process, else None.
    """
    if hidden_states.device_map and not state.is_main_process:
        log.info("device_map placement: rank %d has nothing to do", state.process_index)
        return None
    world, rank = (1, 0) if hidden_states.device_map else (state.num_processes, state.process_index)
    plan = plan_shard(hidden_states, job)
    if state.is_main_process:
        prepare_work(job.work, fingerprint(hidden_states, plan))
    if world > 1:
        state.wait_for_everyone()
    todo = missing_batches(job.work / "parts", plan, rank, world)
    log.info(
        "rank %d/%d: %d batches to run, %d already saved",
        rank,
        world,
        len(todo),
        len(plan.batches[rank::world]) - len(todo),
    )
    if todo:
        run_batches(hidden_states, plan, todo, target.get(hidden_states, job, state.device))
    if world > 1:
        state.wait_for_everyone()
    if not state.is_main_process:
        return None
    return finish_shard(hidden_states, plan)


def extract_shards(
    hidden_states: HiddenStatesSettings, jobs: list[ShardJob], state: Any = None
) -> list[dict[str, Any] | None]:
    """Every job's shard with one load of the target; the work folders go once all are written.

    Args:
        state: an `accelerate.PartialState` (made here when None).
    """
    from accelerate import PartialState

    state = state or PartialState()
    target = TargetModel()
    metas = [extract_shard(hidden_states, job, state, target) for job in jobs]
    if state.is_main_process:
        for job, meta in zip(jobs, metas, strict=True):  # every split packed: all committed at once
            commit_shard(job, meta)
        for job in jobs:
            shutil.rmtree(job.work, ignore_errors=True)
    return metas
