"""train.fsdp in one process: nothing to shard (the draft stays a plain module under accelerate), the
key defaults to off and is left out of the resume fingerprint (the two-process halves:
tests/integration/test_draft_train_fsdp.py)."""

from __future__ import annotations

from dataclasses import replace

from accelerate import Accelerator

from eagle3_pipeline.draft.sharding import full_state, is_sharded, load_full_state
from eagle3_pipeline.draft.train import TrainJob, build_model, fingerprint, prepare
from eagle3_pipeline.settings import TrainSettings, section


def test_fsdp_is_read_at_run_time_and_defaults_to_off(draft_train_job: TrainJob):
    sharded = replace(draft_train_job, train=replace(draft_train_job.train, fsdp=True))
    assert fingerprint(sharded) == fingerprint(draft_train_job)  # a run resumes across it
    assert section(TrainSettings, {"epochs": 1}).fsdp is False


def test_one_process_is_not_sharded_and_its_state_round_trips(draft_train_job: TrainJob):
    job = replace(draft_train_job, train=replace(draft_train_job.train, fsdp=True))
    model, _ = build_model(job)
    model, optimizer, _ = prepare(Accelerator(cpu=True), model, job, total_steps=10)
    assert not is_sharded(model)
    tensors, optim = full_state(model, optimizer)
    assert not any(name.startswith("embed_tokens.") for name in tensors)
    load_full_state(model, optimizer, tensors, optim)
