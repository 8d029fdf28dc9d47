"""train.fsdp in one process: nothing to shard (the draft stays a plain module under accelerate), the
key defaults to off and is left out of the resume fingerprint (the two-process halves:
tests/integration/test_draft_train_fsdp.py); training in bf16, the sharded draft is gathered in bf16
and its gradients, shards and AdamW state are fp32 (FSDP2's MixedPrecisionPolicy, over a one-process
gloo group)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from accelerate import Accelerator

from eagle3_pipeline.draft.data import HiddenStateData
from eagle3_pipeline.draft.fsdp import full_state, is_fsdp, load_full_state, wrap_fsdp
from eagle3_pipeline.draft.train import (
    Context,
    TrainJob,
    _forward,
    build_model,
    build_optimizer,
    fingerprint,
    prepare,
)
from eagle3_pipeline.ports import free_port
from eagle3_pipeline.settings import TrainSettings, section


def test_fsdp_is_read_at_run_time_and_defaults_to_off(draft_train_job: TrainJob):
    sharded = replace(draft_train_job, train=replace(draft_train_job.train, fsdp=True))
    assert fingerprint(sharded) == fingerprint(draft_train_job)  # a run resumes across it
    assert section(TrainSettings, {"epochs": 1}).fsdp is False


def test_one_process_is_not_sharded_and_its_state_round_trips(draft_train_job: TrainJob):
    job = replace(draft_train_job, train=replace(draft_train_job.train, fsdp=True))
    model, _ = build_model(job)
    model, optimizer, _ = prepare(Accelerator(cpu=True), model, job, total_steps=10)
    assert not is_fsdp(model)
    tensors, optim = full_state(model, optimizer)
    assert not any(name.startswith("embed_tokens.") for name in tensors)
    load_full_state(model, optimizer, tensors, optim)


@pytest.fixture
def one_process_group():
    """A gloo process group of one process (FSDP2 shards over it: each shard is the whole tensor)."""
    address = f"tcp://127.0.0.1:{free_port()}"
    torch.distributed.init_process_group("gloo", init_method=address, rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


def test_bf16_training_gathers_bf16_weights_and_keeps_fp32_shards_gradients_and_state(
    draft_train_job: TrainJob, one_process_group
):
    job = draft_train_job
    accelerator = Accelerator(cpu=True)  # one per test process: bf16 autocast below, as on GPUs
    data = HiddenStateData(job.train_shards, job.train.batch_tokens)
    batch = data.collate(data.batches(job.train.seed, 0)[0])
    plain, head = build_model(job, torch.bfloat16)
    sharded, _ = build_model(job, torch.bfloat16)  # the same seeded weights
    sharded = wrap_fsdp(sharded, torch.device("cpu"), torch.bfloat16)
    optimizer, scheduler = build_optimizer(sharded, job.train, total_steps=10)
    trained = [p for p in sharded.parameters() if p.requires_grad]
    losses = {}
    for name, model in (("plain", plain), ("sharded", sharded)):
        ctx = Context(accelerator, model, optimizer, scheduler, head, job)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = _forward(ctx, model, batch)
        if name == "sharded":  # the root stays gathered until the backward pass ends: bf16 copies
            assert model.lm_head.weight.dtype == torch.bfloat16 and model.fc.weight.dtype == torch.bfloat16
        losses[name] = loss.item()
        loss.backward()
    # the bf16 copies' gradients reduced in fp32 into fp32 shards; AdamW steps on fp32 shards
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in trained)
    for p, q in zip(trained, [p for p in plain.parameters() if p.requires_grad], strict=True):
        torch.testing.assert_close(p.grad.full_tensor(), q.grad, rtol=0.02, atol=1e-3)
    # bf16 weights against autocast's bf16 casts of fp32 ones
    assert losses["sharded"] == pytest.approx(losses["plain"], rel=1e-3)
    optimizer.step()
    tensors, optim = full_state(sharded, optimizer)
    assert all(t.dtype == torch.float32 for t in tensors.values())
    assert all(v.dtype == torch.float32 for s in optim["state"].values() for v in s.values() if v.dim())
