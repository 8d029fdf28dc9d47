"""The extraction job file: what rule extract_hidden_states hands to the process that `accelerate
launch` starts, in place of a command line parsed back."""

import json
from pathlib import Path

import pytest

from eagle3_pipeline.hidden_states.job import read_jobs, rule_jobs, write_jobs

SPLITS = ("train", "validation")
SETTINGS = {"layers": "auto", "max_seq_len": 1024, "overlong": "truncate", "dtype": "bfloat16"}
SETTINGS |= {"compute_dtype": "auto", "batch_tokens": 8192, "trust_remote_code": False}
SETTINGS |= {"backend": "vllm", "vllm": {"python": None, "tensor_parallel_size": 2}}


def jobs(**changes):
    return rule_jobs(
        [f"r/traces/shards/{s}/shard-00003.parquet" for s in SPLITS],
        [f"r/hidden_states/{s}/shard-00003.safetensors" for s in SPLITS],
        [f"r/hidden_states/{s}/shard-00003.json" for s in SPLITS],
        3,
        "resources/demo/target/config.json",
        "r/work/hidden_states/00003",
        **(SETTINGS | {"server_json": "r/server/server.json", "device_map": True} | changes),
    )


def test_one_job_per_split_round_trips_through_its_file(tmp_path):
    train, validation = jobs()
    assert train.traces == Path("r/traces/shards/train/shard-00003.parquet") and train.shard == 3
    assert train.target == Path("resources/demo/target") and train.layers == ["auto"]
    assert train.work == Path("r/work/hidden_states/00003/train")  # each split's parts apart
    assert validation.work == Path("r/work/hidden_states/00003/validation")
    assert train.vllm == {"python": None, "tensor_parallel_size": 2} and train.device_map
    path = write_jobs([train, validation], tmp_path / "job.json")
    assert read_jobs(path) == [train, validation]
    assert json.loads(path.read_text())["jobs"][0]["server_json"] == "r/server/server.json"


def test_layers_and_no_snapshot(tmp_path):
    changes = {"layers": [1, 3, 4], "server_json": None, "device_map": False}
    (job,) = rule_jobs(["t.parquet"], ["h/train/s.safetensors"], ["h/train/s.json"], 0, "c.json", "w",
                       **(SETTINGS | changes))  # fmt: skip
    assert job.layers == [1, 3, 4] and job.server_json is None and job.target == Path(".")
    assert read_jobs(write_jobs([job], tmp_path / "j.json")) == [job]


def test_bad_jobs_are_named(tmp_path):
    with pytest.raises(ValueError, match="one output and one metadata file per split"):
        rule_jobs(["a", "b"], ["a"], ["a"], 0, "c.json", "w", **SETTINGS, server_json=None, device_map=False)
    (tmp_path / "empty.json").write_text('{"jobs": []}')
    with pytest.raises(ValueError, match="empty.json is not an extraction job file"):
        read_jobs(tmp_path / "empty.json")
    (tmp_path / "odd.json").write_text('{"jobs": [{"shard": 1, "colour": "red"}]}')
    with pytest.raises(ValueError, match=r"unknown keys \['colour'\]"):
        read_jobs(tmp_path / "odd.json")
    (tmp_path / "short.json").write_text('{"jobs": [{"shard": 1}]}')
    with pytest.raises(ValueError, match="short.json is not an extraction job file"):
        read_jobs(tmp_path / "short.json")
