"""train.fsdp as real processes: two gloo processes with the draft sharded (FSDP2) train to the same
losses and weights as two DDP processes, write state files of the same form (the full tensors), a run
stopped after one step, then on the epoch's last batch, and started again ends where the uninterrupted
one does, and its state file resumes without train.fsdp too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3_pipeline.draft.job import write_job
from eagle3_pipeline.draft.train import TrainJob
from eagle3_pipeline.ports import free_port

TORCHRUN = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port"]
ENV = os.environ | {"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}


def _run(job: TrainJob, out: Path, stop_after_steps: int | None = None, **train: object) -> str:
    """torchrun: two CPU processes of `python -m eagle3_pipeline.draft JOB.json` (rule train_draft's)
    on a port the kernel picks (no fixed number another test may hold); -> their log."""
    moved = replace(job, work=str(out / "work"), weights=str(out / "model.safetensors"))
    moved = replace(moved, history=str(out / "history.json"), stop_after_steps=stop_after_steps)
    moved = replace(moved, train=replace(job.train, **train))
    job_file = write_job(moved, out / "jobs" / "train_draft.json")
    argv = [sys.executable, *TORCHRUN, str(free_port()), "-m", "eagle3_pipeline.draft", str(job_file)]
    result = subprocess.run(argv, env=ENV, timeout=600, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stderr


def _history(out: Path) -> list[dict]:
    return json.loads((out / "history.json").read_text())


@pytest.mark.slow
def test_fsdp_trains_as_ddp_does_and_resumes(draft_train_job, tmp_path):
    job = draft_train_job
    ddp, fsdp, resumed = tmp_path / "ddp", tmp_path / "fsdp", tmp_path / "fsdp-resumed"
    assert "sharded" not in _run(job, ddp, save_every_steps=1)
    assert "AdamW state sharded over 2 processes" in _run(job, fsdp, save_every_steps=1, fsdp=True)
    a, b = _history(ddp), _history(fsdp)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b, strict=True):
        for split in ("train", "validation"):
            assert x[split]["tokens"] == y[split]["tokens"]
            assert y[split]["loss"] == pytest.approx(x[split]["loss"], rel=1e-4)
    wa, wb = load_file(ddp / "model.safetensors"), load_file(fsdp / "model.safetensors")
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-3, atol=1e-5, msg=name)
    # the state file holds the whole tensors and AdamW state, in DDP's form
    sa = torch.load(ddp / "work" / "state.pt", weights_only=False)
    sb = torch.load(fsdp / "work" / "state.pt", weights_only=False)
    assert {k: v.shape for k, v in sa["model"].items()} == {k: v.shape for k, v in sb["model"].items()}
    assert sa["optimizer"]["state"].keys() == sb["optimizer"]["state"].keys()
    for i, state in sa["optimizer"]["state"].items():
        assert {k: v.shape for k, v in state.items()} == {
            k: v.shape for k, v in sb["optimizer"]["state"][i].items()
        }
    # stopped after one step (its state saved), started again: the uninterrupted run's result
    _run(job, resumed, stop_after_steps=1, fsdp=True)
    assert not (resumed / "model.safetensors").exists()
    across = tmp_path / "resumed-by-ddp"  # the same state file resumed without train.fsdp
    (across / "work").mkdir(parents=True)
    shutil.copy(resumed / "work" / "state.pt", across / "work" / "state.pt")
    assert "resuming at epoch 0, step 1" in _run(job, across)
    for x, y in zip(b, _history(across), strict=True):
        assert x["train"]["tokens"] == y["train"]["tokens"]
        assert y["train"]["loss"] == pytest.approx(x["train"]["loss"], rel=1e-4)
    # stopped on epoch 0's last batch (2 per process): resumed, no batch of it is left to train
    _run(job, resumed, stop_after_steps=2, fsdp=True)
    assert not (resumed / "model.safetensors").exists()
    assert "resuming at epoch 0, step 2" in _run(job, resumed, fsdp=True)
    assert _history(resumed) == b
    wc = load_file(resumed / "model.safetensors")
    for name in wb:
        torch.testing.assert_close(wc[name], wb[name], rtol=1e-6, atol=1e-7, msg=name)
