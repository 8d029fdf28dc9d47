"""Draft training as real processes (what rule train_draft launches): a SIGKILLed process resumes to
the same result, and two gloo DDP processes cover the same tokens, also across a stop and resume. The
in-process halves are in tests/unit/test_draft_train.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3_pipeline.draft.job import write_job
from eagle3_pipeline.draft.train import TrainJob, main


@pytest.fixture
def job(draft_train_job: TrainJob) -> TrainJob:
    return draft_train_job


def _job_module(job: TrainJob, out: Path, stop_after_steps: int | None = None, **train: int) -> list[str]:
    """`-m eagle3_pipeline.draft JOB.json` (what rule train_draft launches) for `job` writing under `out`."""
    moved = replace(job, work=str(out / "work"), weights=str(out / "model.safetensors"))
    moved = replace(moved, stop_after_steps=stop_after_steps)
    moved = replace(moved, history=str(out / "history.json"), train=replace(job.train, **train))
    return ["-m", "eagle3_pipeline.draft", str(write_job(moved, out / "jobs" / "train_draft.json"))]


@pytest.mark.slow
def test_a_killed_training_process_resumes_to_the_same_result(job, tmp_path):
    """SIGKILL the real training process once it has saved a state, start it again: same weights."""
    assert main(job)
    out = tmp_path / "killed"
    argv = [sys.executable, *_job_module(job, out, save_every_steps=1)]
    # At the lowest priority, polled every millisecond: the rest of the run after its first saved state
    # takes under a second on an idle machine, and a 0.2 s poll under load once let it finish first.
    process = subprocess.Popen(argv, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.nice(19))
    deadline = time.monotonic() + 300
    while not (out / "work" / "state.pt").exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    process.kill()
    process.wait()
    assert not (out / "model.safetensors").exists(), "finished before it could be killed"
    subprocess.run(argv, check=True, stderr=subprocess.DEVNULL, timeout=600)
    a, b = load_file(job.weights), load_file(out / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-6, atol=1e-7, msg=name)
    assert json.loads(Path(job.history).read_text()) == json.loads((out / "history.json").read_text())


@pytest.mark.slow
def test_two_process_ddp_covers_the_same_tokens(job, tmp_path):
    """torchrun with two CPU processes (gloo DDP): each takes half the batches; metrics are summed
    over both, so the epoch counts every token once, and only the main process writes. Stopped after
    one step (state saved mid-epoch), started again, stopped on the epoch's last batch (nothing of the
    epoch left to train when resumed) and started again, it reports the same metrics and weights."""
    assert main(job)
    out = tmp_path / "ddp"
    argv = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "18575"]
    env = os.environ | {"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    # torchrun runs `python -m eagle3_pipeline.draft JOB.json` twice
    run = [sys.executable, *argv, *_job_module(job, out)]
    subprocess.run(run, check=True, env=env, timeout=600, capture_output=True)
    single, ddp = json.loads(Path(job.history).read_text()), json.loads((out / "history.json").read_text())
    assert [r["step"] for r in ddp] == [r["step"] // 2 for r in single]  # half the steps per process
    for a, b in zip(single, ddp, strict=True):
        assert a["train"]["tokens"] == b["train"]["tokens"]
        assert a["validation"]["tokens"] == b["validation"]["tokens"]
    assert load_file(out / "model.safetensors").keys() == load_file(job.weights).keys()
    resumed = tmp_path / "ddp-resumed"
    # each rank holds its own partial sums when stopped: the file must hold both; step 2 is the last of
    # epoch 0 (2 batches per process), so the next start trains none of it and every rank still reduces
    for stop in (1, 2, None):
        run = [sys.executable, *argv, *_job_module(job, resumed, stop_after_steps=stop)]
        subprocess.run(run, check=True, env=env, timeout=600, capture_output=True)
    assert json.loads((resumed / "history.json").read_text()) == ddp
    a, b = load_file(out / "model.safetensors"), load_file(resumed / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-6, atol=1e-7, msg=name)
