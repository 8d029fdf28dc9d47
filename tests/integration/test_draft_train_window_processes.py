"""Windowed draft training (hidden_states.max_disk_gb) as two gloo processes: a window stopped on its
last batch (its state saved, none of its batches left to train) resumes, under DDP and under FSDP, to
the uninterrupted run's state. The in-process halves are in tests/unit/test_draft_train.py; the
epoch-level ones in test_draft_train_processes.py (DDP) and test_draft_train_fsdp.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from eagle3_pipeline.draft.data import HiddenStateData
from eagle3_pipeline.draft.job import WindowJob, write_job
from eagle3_pipeline.draft.train import TrainJob
from eagle3_pipeline.draft.window_batches import order_key
from eagle3_pipeline.ports import free_port

TORCHRUN = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port"]
ENV = os.environ | {"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
# a whole window job takes seconds; a collective joined by one process only hangs until this
TIMEOUT_S = 240


def _windows(job: TrainJob, root: Path, previous: str | None = None) -> list[TrainJob]:
    """The two window jobs of one epoch: window 0 = train shard 0 and the validation shard, window 1 =
    train shard 1, the plan counted as rule plan_windows counts it (all processes' batches).
    `previous`: window 1 starts from this state file instead of window 0's."""
    windows = [([job.train_shards[0]], job.validation_shards), ([job.train_shards[1]], [])]
    seed, tokens = job.train.seed, job.train.batch_tokens
    counts = [
        len(HiddenStateData(train, tokens).batches(seed, order_key(0, w)))
        for w, (train, _) in enumerate(windows)
    ]
    plan = root / "plan.json"
    plan.parent.mkdir(parents=True, exist_ok=True)
    plan.write_text(json.dumps({"windows": [[["00000"], ["00001"]]], "batches": [counts]}))
    states = [str(root / "epoch-0" / f"window-{w}.pt") for w in range(2)]
    before = [None, previous or states[0]]
    return [
        replace(
            job,
            train_shards=train,
            validation_shards=validation,
            work=str(root / "work"),
            window=WindowJob(0, w, 2, str(plan), before[w], states[w], [f"{w:05d}"]),
        )
        for w, (train, validation) in enumerate(windows)
    ]


def _run(job: TrainJob, stop_after_steps: int | None = None, **train: object) -> str:
    """torchrun: two CPU processes of `python -m eagle3_pipeline.draft JOB.json` (rule
    train_draft_window's), stopped past TIMEOUT_S; -> their log."""
    job = replace(job, stop_after_steps=stop_after_steps, train=replace(job.train, **train))
    job_file = write_job(job, Path(job.work) / "jobs" / f"window-{job.window.window}.json")
    argv = [sys.executable, *TORCHRUN, str(free_port()), "-m", "eagle3_pipeline.draft", str(job_file)]
    log_path = job_file.with_suffix(".log")
    with log_path.open("w") as log:  # a file, not a pipe: nothing left to wait on if a worker outlives it
        process = subprocess.Popen(argv, env=ENV, stdout=log, stderr=subprocess.STDOUT)
        try:
            process.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # torchrun's workers run in sessions of their own: SIGTERM has torchrun stop them
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            pytest.fail(f"window job hung past {TIMEOUT_S} s: {log_path.read_text()[-4000:]}")
    assert process.returncode == 0, log_path.read_text()[-4000:]
    return log_path.read_text()


def _state(window_job: TrainJob) -> dict:
    return torch.load(window_job.window.state, weights_only=False)


@pytest.mark.slow
def test_windows_stopped_on_their_last_batch_resume_under_ddp_and_fsdp(draft_train_job, tmp_path):
    """Six two-process launches (their start-up is most of the time): the uninterrupted two windows;
    window 0 under DDP stopped on its last batch and resumed; window 1 under FSDP, from that window 0,
    stopped on its last batch (the epoch's last) and resumed."""
    job = replace(draft_train_job, train=replace(draft_train_job.train, epochs=1))
    whole = _windows(job, tmp_path / "whole")
    for window_job in whole:
        _run(window_job)
    first, expected = _state(whole[0]), _state(whole[1])
    assert first["state"]["step"] == 1 and expected["state"]["step"] == 2  # one batch per process each
    assert len(expected["state"]["history"]) == 1  # the epoch's record, written by its last window

    # DDP, stopped on window 0's last batch (not the epoch's last window: its sums are carried on)
    ddp = _windows(job, tmp_path / "ddp")[0]
    _run(ddp, stop_after_steps=1)
    assert not Path(ddp.window.state).exists()  # stopped before the window's end
    assert "resuming at epoch 0, step 1" in _run(ddp)
    got = _state(ddp)
    for key in ("step", "epoch_stats", "validation_stats", "carried_stats", "history"):
        assert got["state"][key] == first["state"][key], key  # the sums reduced once, none lost
    for name, tensor in first["model"].items():
        torch.testing.assert_close(got["model"][name], tensor, rtol=1e-6, atol=1e-7, msg=name)

    # FSDP, from DDP's window-0 file, stopped on window 1's last batch (the epoch's last: it writes the
    # record from the reduced sums)
    fsdp = _windows(job, tmp_path / "fsdp", previous=ddp.window.state)[1]
    _run(fsdp, stop_after_steps=2, fsdp=True)
    assert not Path(fsdp.window.state).exists()
    assert "resuming at epoch 0, step 2" in _run(fsdp, fsdp=True)
    got = _state(fsdp)
    (x,), (y,) = expected["state"]["history"], got["state"]["history"]
    assert y["step"] == x["step"]
    for split in ("train", "validation"):
        assert y[split]["tokens"] == x[split]["tokens"]  # every token once: no sum lost or doubled
        assert y[split]["loss"] == pytest.approx(x[split]["loss"], rel=1e-4)
    for name, tensor in expected["model"].items():
        torch.testing.assert_close(got["model"][name], tensor, rtol=1e-3, atol=1e-5, msg=name)
