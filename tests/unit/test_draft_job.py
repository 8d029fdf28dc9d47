"""The training job file: what rules train_draft and train_draft_window hand to the processes that
`accelerate launch` starts, in place of a command line parsed back."""

import json

import pytest

from eagle3_pipeline.draft.job import WindowJob, read_job, rule_job, single_path, write_job

DRAFT = {"draft_vocab_size": 32000, "ttt_steps": 7, "step_weight_decay": 0.8, "head_dim": None}
TRAIN = {"epochs": 2, "lr": "1e-3", "warmup_ratio": 0.0, "weight_decay": 0, "grad_clip": 0.5}
TRAIN |= {"batch_tokens": 64, "seed": 0, "save_every_steps": 10, "unrelated": "ignored"}
STATES = ["h/train/shard-00000.safetensors", "h/validation/shard-00000.safetensors"]
STATES += ["h/train/shard-00001.safetensors"]


def test_a_job_round_trips_through_its_file(tmp_path):
    job = rule_job(STATES, "d/vocab_map.safetensors", "t/config.json", DRAFT, TRAIN, "w/train", 1,
                   weights="d/model.safetensors", history="d/history.json")  # fmt: skip
    assert job.train_shards == [STATES[0], STATES[2]] and job.validation_shards == [STATES[1]]
    assert job.target == "t" and job.cpu_threads == 1 and job.window is None
    assert job.draft == {"ttt_steps": 7, "step_weight_decay": 0.8}  # the shape keys only when set
    assert job.train["lr"] == 1e-3 and isinstance(job.train["lr"], float)  # typed once, here
    assert isinstance(job.train["weight_decay"], float) and "unrelated" not in job.train
    path = write_job(job, tmp_path / "jobs" / "train_draft.json")
    assert read_job(path) == job
    assert json.loads(path.read_text())["train_shards"] == job.train_shards  # a plain JSON file


def test_a_window_job_and_the_draft_shape_round_trip(tmp_path):
    window = WindowJob(1, 0, 2, "d/windows/plan.json", None, "d/windows/epoch-1/window-0.pt")
    shape = {"head_dim": 16, "num_attention_heads": "4", "num_key_value_heads": 2}
    job = rule_job(STATES, "v", "t/config.json", DRAFT | shape, TRAIN, "w", 0, window=window)
    assert job.draft == {"ttt_steps": 7, "step_weight_decay": 0.8} | shape | {"num_attention_heads": 4}
    assert read_job(write_job(job, tmp_path / "j.json")) == job


def test_a_wrong_file_is_named(tmp_path):
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ValueError, match="list.json"):
        read_job(tmp_path / "list.json")
    (tmp_path / "other.json").write_text('{"shards": []}')
    with pytest.raises(ValueError, match="other.json is not a training job file"):
        read_job(tmp_path / "other.json")
    with pytest.raises(KeyError, match="ttt_steps"):
        rule_job(STATES, "v", "t/config.json", {}, TRAIN, "w", 0)


def test_single_path():
    assert single_path("a") == "a" and single_path([]) is None and single_path(["b"]) == "b"
    with pytest.raises(ValueError, match="at most one"):
        single_path(["a", "b"])
