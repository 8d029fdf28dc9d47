"""Draft training in process: a few steps lower the loss; an interrupted-and-resumed run equals an
uninterrupted one (the real-process halves: tests/integration/test_draft_train_processes.py)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3_pipeline.draft.data import HiddenStateData, plan_batches
from eagle3_pipeline.draft.job import WindowJob
from eagle3_pipeline.draft.train import TrainJob, build_model, build_optimizer, finish, main
from eagle3_pipeline.draft.window_batches import order_key
from eagle3_pipeline.settings import DraftSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the references

from ttt_reference import target_distribution, ttt_loss  # noqa: E402


@pytest.fixture
def job(draft_train_job: TrainJob) -> TrainJob:
    return draft_train_job


def test_a_few_steps_lower_the_loss(job):
    model, head = build_model(job)
    optimizer, _ = build_optimizer(model, job.train, total_steps=1000)
    data = HiddenStateData(job.train_shards, 256)
    batch = data.collate(data.batches(seed=0, epoch=0)[0])
    frozen = head["lm_head"], head["t2d"], head["draft_ids"]
    probs, in_draft = target_distribution(batch.final_hidden_states, *frozen)
    losses = []
    for _ in range(12):
        loss, _ = ttt_loss(model(batch.aux_hidden_states, batch.input_ids, 3), batch, probs, in_draft, 0.8)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05, losses


def test_resume_after_an_interruption_equals_an_uninterrupted_run(job, tmp_path):
    assert main(job)
    interrupted = replace(
        job, work=str(tmp_path / "work2"), weights=str(tmp_path / "b" / "model.safetensors")
    )
    interrupted = replace(interrupted, history=str(tmp_path / "b" / "history.json"))
    # mid-epoch 0 (4 batches per epoch), then on its last batch: resumed, none of it is left to train
    for stop in (3, 4):
        assert not main(replace(interrupted, stop_after_steps=stop))
        assert not Path(interrupted.weights).exists()
    assert main(interrupted)
    a, b = load_file(job.weights), load_file(interrupted.weights)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-6, atol=1e-7, msg=name)
    history_a, history_b = (
        json.loads(Path(job.history).read_text()),
        json.loads(Path(interrupted.history).read_text()),
    )
    assert len(history_a) == 2
    assert history_a == history_b
    assert history_a[-1]["train"]["loss"] < history_a[0]["train"]["loss"]
    assert set(history_a[0]["validation"]) >= {"loss", "step_accuracy", "conditional_accuracy"}


def test_state_saved_for_other_settings_is_not_resumed(job, caplog):
    assert not main(replace(job, stop_after_steps=2))
    changed = replace(job, train=replace(job.train, lr=1e-3))
    with caplog.at_level("WARNING"):
        assert main(changed)
    assert "starting afresh" in caplog.text


def test_a_set_draft_shape_is_trained_and_exported(job, random_target, draft_hidden_states, tmp_path):
    """draft.head_dim and the heads reach the model, its saved shape, and the exported config.json (the
    random target has 2 heads of 32; the draft gets 4 heads of 16 sharing 2 kv heads)."""
    from eagle3_pipeline.draft.export import export_checkpoint

    job = replace(job, draft=replace(job.draft, head_dim=16, num_attention_heads=4, num_key_value_heads=2))
    job = replace(job, train=replace(job.train, epochs=1))
    model, _ = build_model(job)
    assert model.midlayer.self_attn.q_proj.weight.shape == (64, 128)  # 4 x 16 from 2H
    assert model.midlayer.self_attn.k_proj.weight.shape == (32, 128)  # 2 x 16
    assert main(job)
    out = tmp_path / "checkpoint"
    metadata = draft_hidden_states["train"][0].with_suffix(".json")
    export_checkpoint(job.weights, job.vocab_map, random_target / "config.json", metadata,
                      out / "config.json", out / "model.safetensors")  # fmt: skip
    config = json.loads((out / "config.json").read_text())
    assert (config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]) == (16, 4, 2)


def _windowed(job: TrainJob, root: Path, epochs: int = 2) -> list[TrainJob]:
    """The jobs of a windowed run (hidden_states.max_disk_gb): window 0 = train shard 0 and the
    validation shard, window 1 = train shard 1; the plan counted as rule plan_windows counts it."""
    windows = [([job.train_shards[0]], job.validation_shards), ([job.train_shards[1]], [])]
    lengths = [[s.length for s in HiddenStateData(train, 256).samples] for train, _ in windows]
    plan = root / "plan.json"
    plan.parent.mkdir(parents=True, exist_ok=True)
    batches = [
        [len(plan_batches(lengths[w], 256, 0, order_key(e, w))) for w in range(2)] for e in range(epochs)
    ]
    plan.write_text(json.dumps({"windows": [[["00000"], ["00001"]]] * epochs, "batches": batches}))
    jobs, previous = [], None
    for e in range(epochs):
        for w, (train, validation) in enumerate(windows):
            state = str(root / f"epoch-{e}" / f"window-{w}.pt")
            window = WindowJob(e, w, len(windows), str(plan), previous, state, [f"{w:05d}"])
            jobs.append(
                replace(
                    job,
                    train_shards=train,
                    validation_shards=validation,
                    work=str(root / "work"),
                    window=window,
                )
            )
            previous = state
    return jobs


def test_windowed_training_carries_its_state_and_spans_one_schedule(job, tmp_path):
    jobs = _windowed(replace(job, train=replace(job.train, epochs=2)), tmp_path / "a")
    for window_job in jobs:
        assert main(window_job)
    last = torch.load(jobs[-1].window.state, weights_only=False)
    steps = sum(sum(epoch) for epoch in json.loads(Path(jobs[0].window.plan).read_text())["batches"])
    assert last["state"]["step"] == steps  # every window of every epoch, one schedule
    assert last["scheduler"]["last_epoch"] == steps
    finish(job, jobs[-1].window.state)
    history = json.loads(Path(job.history).read_text())
    assert [record["epoch"] for record in history] == [0, 1]
    assert history[-1]["train"]["loss"] < history[0]["train"]["loss"]
    assert history[0]["validation"]["tokens"] > 0  # window 0's validation states, summed per epoch
    assert set(load_file(job.weights)) >= {"fc.weight", "lm_head.weight"}


def test_a_killed_window_resumes_to_the_same_state(job, tmp_path):
    whole = _windowed(job, tmp_path / "a")
    for window_job in whole:
        assert main(window_job)
    parts = _windowed(job, tmp_path / "b")
    assert main(parts[0])
    assert not main(replace(parts[1], stop_after_steps=_steps_after(parts[0]) + 1))  # mid window 1
    assert not Path(parts[1].window.state).exists()  # killed mid-window: no state file yet
    for window_job in parts[1:]:
        assert main(window_job)
    a = torch.load(whole[-1].window.state, weights_only=False)
    b = torch.load(parts[-1].window.state, weights_only=False)
    assert a["state"]["history"] == b["state"]["history"]
    for name in a["model"]:
        torch.testing.assert_close(a["model"][name], b["model"][name], rtol=1e-6, atol=1e-7, msg=name)


def _steps_after(window_job: TrainJob) -> int:
    return torch.load(window_job.window.state, weights_only=False)["state"]["step"]


def test_state_files_hold_what_a_resume_needs_and_at_most_two_exist(job, tmp_path, monkeypatch):
    """A state file is the trained tensors, AdamW and the schedule (no frozen embeddings), of the size
    planning.state_files.state_file_bytes counts under hidden_states.max_disk_gb; windowed training never
    has more than two on disk (the previous window's and this window's latest)."""
    from eagle3_pipeline import io
    from eagle3_pipeline.planning.state_files import (
        STATE_FILE_OVERHEAD,
        STATE_FILES_AT_ONCE,
        state_file_bytes,
    )

    jobs = _windowed(replace(job, train=replace(job.train, epochs=1, save_every_steps=1)), tmp_path / "w")
    write_torch, seen = io.write_torch, []

    def counting(blob, path):  # noqa: ANN001, ANN202
        window = current.window
        held = [
            p for p in (window.previous, str(_state_path_of(current)), window.state) if p and Path(p).exists()
        ]
        seen.append(len(held) + (str(path) not in held))  # with the file being written
        return write_torch(blob, path)

    monkeypatch.setattr(io, "write_torch", counting)
    for current in jobs:
        assert main(current)
    assert max(seen) <= STATE_FILES_AT_ONCE and len(seen) > len(jobs)  # mid-window saves included
    assert not _state_path_of(jobs[-1]).exists()  # the window's file replaced the work folder's
    blob = torch.load(jobs[-1].window.state, weights_only=False)
    assert not any(name.startswith("embed_tokens.") for name in blob["model"])
    target = json.loads((Path(job.target) / "config.json").read_text())
    counted = state_file_bytes(DraftSettings(draft_vocab_size=64), target)
    size = Path(jobs[-1].window.state).stat().st_size
    assert counted - STATE_FILE_OVERHEAD <= size <= counted, (size, counted)


def _state_path_of(window_job: TrainJob) -> Path:
    return Path(window_job.work) / "state.pt"


def test_a_window_whose_batches_differ_from_the_plan_is_refused(job, tmp_path):
    first = _windowed(job, tmp_path / "w")[0]
    plan = json.loads(Path(first.window.plan).read_text())
    plan["batches"][0][0] += 1
    Path(first.window.plan).write_text(json.dumps(plan))
    with pytest.raises(ValueError, match="planned .* from the traces' token ids"):
        main(first)


def test_a_window_whose_shards_differ_from_the_plan_is_refused(job, tmp_path):
    first = _windowed(job, tmp_path / "w")[0]
    plan = json.loads(Path(first.window.plan).read_text())
    plan["windows"][0] = [["00001"], ["00000"]]  # the plan gave shard 0 to window 1
    Path(first.window.plan).write_text(json.dumps(plan))
    with pytest.raises(ValueError, match=r"states of shards \['00000'\], but .* assigned \['00001'\]"):
        main(first)


def test_activation_checkpointing_reaches_the_model_and_not_the_resume_fingerprint(job):
    from eagle3_pipeline.draft.train import fingerprint

    checkpointed = replace(job, train=replace(job.train, activation_checkpointing=True))
    assert build_model(checkpointed)[0].checkpointing and not build_model(job)[0].checkpointing
    assert fingerprint(checkpointed) == fingerprint(job)  # the same numbers: a run resumes across it
