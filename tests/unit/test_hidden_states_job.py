"""The extraction job file: what rule extract_hidden_states hands to the process that `accelerate
launch` starts, in place of a command line parsed back."""

import json
from pathlib import Path

import pytest

from eagle3_pipeline.hidden_states.job import (
    launch_mode,
    read_jobs,
    recorded_launch_mode,
    rule_jobs,
    write_jobs,
)
from eagle3_pipeline.launch import LaunchMode
from eagle3_pipeline.settings import HiddenStatesSettings, runtime_only, section

SPLITS = ("train", "validation")
HIDDEN_STATES = section(
    HiddenStatesSettings,
    {"max_seq_len": 1024, "batch_tokens": 8192, "vllm": {"python": None, "tensor_parallel_size": 2}},
)


def jobs(**changes):
    return rule_jobs(
        [f"r/traces/shards/{s}/shard-00003.parquet" for s in SPLITS],
        [f"r/hidden_states/{s}/shard-00003.safetensors" for s in SPLITS],
        [f"r/hidden_states/{s}/shard-00003.json" for s in SPLITS],
        3,
        "resources/demo/target/config.json",
        "r/work/hidden_states/00003",
        **({"server_json": "r/server/server.json"} | changes),
    )


def test_one_job_per_split_round_trips_through_its_file(tmp_path):
    train, validation = jobs()
    assert train.traces == Path("r/traces/shards/train/shard-00003.parquet") and train.shard == 3
    assert train.target == Path("resources/demo/target")
    assert train.work == Path("r/work/hidden_states/00003/train")  # each split's parts apart
    assert validation.work == Path("r/work/hidden_states/00003/validation")
    path = write_jobs(HIDDEN_STATES, [train, validation], tmp_path / "job.json")
    assert read_jobs(path) == (HIDDEN_STATES, [train, validation])
    assert json.loads(path.read_text())["jobs"][0]["server_json"] == "r/server/server.json"
    assert train.pack_dir is None  # no pack slots: packs at once (tests, benchmarks)
    kept = jobs(pack_dir="r/work/hidden_states/pack_slots")
    assert read_jobs(write_jobs(HIDDEN_STATES, kept, tmp_path / "kept.json"))[1] == kept
    assert kept[0].pack_dir == Path("r/work/hidden_states/pack_slots")
    assert json.loads(path.read_text())["hidden_states"]["vllm"]["tensor_parallel_size"] == 2


def test_layers_and_no_snapshot(tmp_path):
    (job,) = rule_jobs(["t.parquet"], ["h/train/s.safetensors"], ["h/train/s.json"], 0, "c.json", "w")
    assert job.server_json is None and job.engine_dir is None and job.target == Path(".")
    hidden_states = section(HiddenStatesSettings, {"layers": [1, 3, 4], "backend": "transformers"})
    assert read_jobs(write_jobs(hidden_states, [job], tmp_path / "j.json")) == (hidden_states, [job])
    assert hidden_states.layers == (1, 3, 4)


def test_the_launch_mode_follows_the_backend_and_device_map():
    assert launch_mode(HiddenStatesSettings(backend="vllm", device_map=True)) is LaunchMode.CLIENT
    assert launch_mode(HiddenStatesSettings(backend="transformers", device_map=True)) is LaunchMode.DEVICE_MAP
    assert launch_mode(HiddenStatesSettings(backend="transformers")) is LaunchMode.DDP
    # the rule's rerun trigger, in the form its first runs recorded (the vllm client's as device_map)
    recorded = [
        recorded_launch_mode(HiddenStatesSettings(backend=b, device_map=d))
        for b, d in (("vllm", False), ("transformers", True), ("transformers", False))
    ]
    assert recorded == ["device_map", "device_map", "ddp"]


def test_bad_jobs_are_named(tmp_path):
    with pytest.raises(ValueError, match="one output and one metadata file per split"):
        rule_jobs(["a", "b"], ["a"], ["a"], 0, "c.json", "w")
    (tmp_path / "empty.json").write_text('{"jobs": []}')
    with pytest.raises(ValueError, match="empty.json is not an extraction job file"):
        read_jobs(tmp_path / "empty.json")
    (tmp_path / "odd.json").write_text('{"jobs": [{"shard": 1, "colour": "red"}]}')
    with pytest.raises(ValueError, match=r"unknown keys \['colour'\]"):
        read_jobs(tmp_path / "odd.json")
    (tmp_path / "short.json").write_text('{"jobs": [{"shard": 1}]}')
    with pytest.raises(ValueError, match="short.json is not an extraction job file"):
        read_jobs(tmp_path / "short.json")
    (job,) = jobs(server_json=None)[:1]
    (tmp_path / "tp.json").write_text(json.dumps({"hidden_states": {"vllm": {"tp": 8}}, "jobs": [{
        k: str(v) if isinstance(v, Path) else v for k, v in job.__dict__.items()}]}))  # fmt: skip
    with pytest.raises(ValueError, match="hidden_states: VllmEngineSettings has no field 'tp'"):
        read_jobs(tmp_path / "tp.json")


def test_the_rules_run_time_values_join_the_recorded_section():
    # as engine_runtime (rules/common/engine.smk): the engine's pacing keys beside the recorded section
    runtime = runtime_only(
        hidden_states={"device_map": True, "pack_slots": 2, "vllm": {"max_clients": 3}},
        packing={"dir": "r/work/hidden_states/pack_slots"},
    )
    recorded = {"backend": "transformers", "vllm": {"python": "p", "tensor_parallel_size": 2}}
    merged = runtime.section("hidden_states", recorded)  # what whole() then builds the section from
    assert merged["device_map"] and merged["backend"] == "transformers" and merged["pack_slots"] == 2
    assert runtime.section("packing")["dir"] == "r/work/hidden_states/pack_slots"
    assert merged["vllm"] == {"python": "p", "tensor_parallel_size": 2, "max_clients": 3}
