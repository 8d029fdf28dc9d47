"""The training job file: what rules train_draft and train_draft_window hand to the processes that
`accelerate launch` starts, in place of a command line parsed back."""

import json

import pytest

from eagle3_pipeline.draft.job import (
    WindowJob,
    draft_identity,
    read_job,
    rule_job,
    single_path,
    train_identity,
    write_job,
)
from eagle3_pipeline.settings import DraftSettings, TrainSettings, section

DRAFT = section(DraftSettings, {"draft_vocab_size": 32000, "ttt_steps": 7, "step_weight_decay": 0.8})
TRAIN = section(TrainSettings, {"epochs": 2, "lr": 1e-3, "warmup_ratio": 0.0, "weight_decay": 0})
TRAIN_STATES = ["h/train/shard-00000.safetensors", "h/train/shard-00001.safetensors"]
VALIDATION_STATES = ["h/validation/shard-00000.safetensors"]


def test_a_job_round_trips_through_its_file(tmp_path):
    job = rule_job(TRAIN_STATES, VALIDATION_STATES, "d/vocab_map.safetensors", "t/config.json", DRAFT, TRAIN,
                   "w/train", 1, weights="d/model.safetensors", history="d/history.json")  # fmt: skip
    assert job.train_shards == TRAIN_STATES and job.validation_shards == VALIDATION_STATES
    assert job.target == "t" and job.cpu_threads == 1 and job.window is None
    assert job.draft == DRAFT and job.train.lr == 1e-3
    # a float field given as an int (the schema allows `0`) is typed once, here
    assert isinstance(job.train.weight_decay, float)
    path = write_job(job, tmp_path / "jobs" / "train_draft.json")
    assert read_job(path) == job
    assert json.loads(path.read_text())["train_shards"] == job.train_shards  # a plain JSON file


def test_a_window_job_and_the_draft_shape_round_trip(tmp_path):
    window = WindowJob(1, 0, 2, "d/windows/plan.json", None, "d/windows/epoch-1/window-0.pt", ["00000"])
    shaped = section(DraftSettings, {"head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 2})
    job = rule_job(TRAIN_STATES, [], "v", "t/config.json", shaped, TRAIN, "w", 0, window=window)
    assert read_job(write_job(job, tmp_path / "j.json")) == job


def test_the_fingerprinted_settings_are_those_of_the_weights():
    # the shape keys only when set, the norms only when on: a draft without them keeps its fingerprint
    assert draft_identity(DRAFT) == {"ttt_steps": 7, "step_weight_decay": 0.8}
    on = section(DraftSettings, {"head_dim": 16, "fc_norm": True})
    assert draft_identity(on) == {"ttt_steps": 7, "step_weight_decay": 0.8, "head_dim": 16, "fc_norm": True}
    assert set(train_identity(TRAIN)) == {"epochs", "lr", "warmup_ratio", "weight_decay", "grad_clip",
                                          "batch_tokens", "seed"}  # fmt: skip


def test_a_wrong_file_is_named(tmp_path):
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ValueError, match="list.json"):
        read_job(tmp_path / "list.json")
    (tmp_path / "other.json").write_text('{"shards": []}')
    with pytest.raises(ValueError, match="other.json is not a training job file"):
        read_job(tmp_path / "other.json")
    with pytest.raises(ValueError, match="needs hidden states of the train split"):
        rule_job([], VALIDATION_STATES, "v", "t/config.json", DRAFT, TRAIN, "w", 0)


def test_single_path():
    assert single_path("a") == "a" and single_path([]) is None and single_path(["b"]) == "b"
    with pytest.raises(ValueError, match="at most one"):
        single_path(["a", "b"])


def test_training_processes_get_expandable_cuda_segments_unless_the_user_set_the_allocator():
    from eagle3_pipeline.draft.__main__ import configure_cuda_allocator

    environ: dict[str, str] = {}
    configure_cuda_allocator(environ)
    assert environ == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    mine = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    configure_cuda_allocator(mine)
    assert mine == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
