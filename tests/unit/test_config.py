"""Config validation: the demo default is valid; bad configs fail with the key and the fix named."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from eagle3_pipeline.config import ConfigError, check_config, shard_ids

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "config" / "schema.yaml"


@pytest.fixture
def demo_config(monkeypatch) -> dict:
    monkeypatch.chdir(ROOT)  # dataset.path is relative to the workflow directory
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def test_demo_config_is_valid_and_complete(demo_config):
    checked = check_config(copy.deepcopy(demo_config), SCHEMA)
    assert checked["run"] == "demo"
    assert checked["generation"]["max_tokens"] == demo_config["generation"]["max_tokens"]


def test_every_schema_key_has_description_and_default():
    schema = yaml.safe_load(SCHEMA.read_text())
    missing = []

    def walk(node: dict, path: str) -> None:
        for name, sub in node.get("properties", {}).items():
            key = f"{path}.{name}".lstrip(".")
            if "description" not in sub:
                missing.append(f"{key}: description")
            required = name in node.get("required", [])
            if "default" not in sub and not required:
                missing.append(f"{key}: default")
            if sub.get("type") == "object":
                assert sub.get("additionalProperties") is False or "properties" not in sub, key
                walk(sub, key)

    walk(schema, "")
    assert missing == []


def test_defaults_fill_missing_sections(demo_config):
    del demo_config["validate"]
    del demo_config["generation"]["retries"]
    checked = check_config(demo_config, SCHEMA)
    assert checked["validate"]["num_speculative_tokens"] == 3
    assert checked["generation"]["retries"] == 5


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c.update(bogus=1), ["bogus", "top level"]),
        (lambda c: c["generation"].update(max_token=10), ["max_token", "generation", "max_tokens"]),
        (lambda c: c["dataset"].update(num_samples="many"), ["dataset.num_samples", "integer"]),
        (lambda c: c["server"]["ssh"].update(known_hosts="yes"), ["server.ssh.known_hosts", "strict"]),
        (lambda c: c["hidden_states"].update(layers=[1, 2]), ["hidden_states.layers"]),
        (lambda c: c["traces"].update(validation_fraction=0.9), ["traces.validation_fraction", "0.5"]),
        (lambda c: c.update(run="my run/1"), ["run"]),
        (lambda c: c["dataset"].pop("path"), ["path", "dataset"]),
    ],
)
def test_bad_config_names_key_and_fix(demo_config, mutate, expected):
    mutate(demo_config)
    with pytest.raises(ConfigError) as error:
        check_config(demo_config, SCHEMA)
    for fragment in expected:
        assert fragment in str(error.value)


def test_missing_dataset_file_is_named(demo_config):
    demo_config["dataset"]["path"] = "data/nope.jsonl"
    with pytest.raises(ConfigError, match=r"dataset\.path.*data/nope\.jsonl.*does not exist"):
        check_config(demo_config, SCHEMA)


def test_remote_dataset_is_not_checked_at_parse_time(demo_config):
    demo_config["dataset"]["path"] = "hf://datasets/mlabonne/open-perfectblend"
    assert check_config(demo_config, SCHEMA)["dataset"]["path"].startswith("hf://")


@pytest.mark.parametrize(("num_samples", "shard_size", "count"), [(256, 64, 4), (257, 64, 5), (1, 64, 1)])
def test_shard_ids_come_from_config(num_samples, shard_size, count):
    ids = shard_ids(num_samples, shard_size)
    assert len(ids) == count
    assert ids[0] == "00000"
    assert ids[-1] == f"{count - 1:05d}"


@pytest.mark.parametrize(
    "unit",
    ["vllm", "vllm.socket", "../../etc/x.service", "a/b.service", "vllm@.service", "a..b.service",
     "vllm service.service", "x" * 248 + ".service", "vllm@a@b.service"],
)  # fmt: skip
def test_unit_name_checked_at_config_time(demo_config, unit):
    """A name systemd would not start, or one that escapes the drop-in folder, fails naming server.unit."""
    demo_config["server"]["unit"] = unit
    with pytest.raises(ConfigError, match=r"'server\.unit'.*not allowed.*ending in \.service"):
        check_config(demo_config, SCHEMA)


@pytest.mark.parametrize(
    "unit", ["vllm.service", "vllm@gpu0.service", "vllm-k2.5_b:1.service", r"a\x2db.service"]
)
def test_systemd_unit_names_accepted(demo_config, unit):
    demo_config["server"]["unit"] = unit
    assert check_config(demo_config, SCHEMA)["server"]["unit"] == unit


def test_unit_name_pattern_is_defined_once():
    """The schema's pattern is the parser's (server/unit.py), so the two cannot drift."""
    from eagle3_pipeline.server.unit import UNIT_NAME_MAX, UNIT_NAME_PATTERN

    unit_schema = yaml.safe_load(SCHEMA.read_text())["properties"]["server"]["properties"]["unit"]
    assert unit_schema["pattern"] == UNIT_NAME_PATTERN and unit_schema["maxLength"] == UNIT_NAME_MAX


def _target_with_layers(folder: Path, num_layers: int, nested: bool = False) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    text = {"model_type": "llama", "num_hidden_layers": num_layers}
    config = {"model_type": "kimi_k25", "text_config": text} if nested else text
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize("nested", [False, True])
def test_layers_out_of_range_are_refused_at_parse_time(demo_config, tmp_path, nested):
    demo_config["target"]["model"] = _target_with_layers(tmp_path / "t", 8, nested)
    demo_config["hidden_states"]["layers"] = [1, 3, 8]
    with pytest.raises(ConfigError, match=r"hidden_states\.layers.*\[1, 3, 8\].*8 decoder layers.*\[0, 7\]"):
        check_config(demo_config, SCHEMA)
    demo_config["hidden_states"]["layers"] = [1, 3, 7]
    assert check_config(demo_config, SCHEMA)["hidden_states"]["layers"] == [1, 3, 7]


def test_auto_layers_on_a_too_shallow_target_are_refused(demo_config, tmp_path):
    demo_config["target"]["model"] = _target_with_layers(tmp_path / "t", 4)
    with pytest.raises(ConfigError, match=r"hidden_states\.layers.*auto needs >= 5.*has 4"):
        check_config(demo_config, SCHEMA)


def test_repeated_layers_are_refused_even_before_the_target_exists(demo_config, tmp_path):
    demo_config["target"]["model"] = str(tmp_path / "not-built-yet")
    demo_config["hidden_states"]["layers"] = [2, 2, 4]
    with pytest.raises(ConfigError, match=r"hidden_states\.layers.*repeats"):
        check_config(demo_config, SCHEMA)
    demo_config["hidden_states"]["layers"] = [2, 3, 40]  # the job checks the depth once it is built
    assert check_config(demo_config, SCHEMA)


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [("backend", "sglang", "hidden_states.backend"), ("vllm", {"tp": 8}, "tp")],
)
def test_bad_backend_settings_name_the_key(demo_config, key, value, fragment):
    demo_config["hidden_states"][key] = value
    with pytest.raises(ConfigError, match=fragment):
        check_config(demo_config, SCHEMA)


def test_demo_and_production_default_to_the_vllm_backend(demo_config):
    assert check_config(demo_config, SCHEMA)["hidden_states"]["backend"] == "vllm"
    kimi = yaml.safe_load((ROOT / "config" / "examples" / "kimi-k2.5-8gpu.yaml").read_text())
    assert kimi["hidden_states"]["backend"] == "vllm"
    assert kimi["hidden_states"]["vllm"]["tensor_parallel_size"] == 8


def test_a_training_batch_smaller_than_the_longest_sample_is_refused(demo_config):
    demo_config["train"]["batch_tokens"] = 512
    demo_config["hidden_states"]["max_seq_len"] = 2048
    with pytest.raises(ConfigError) as error:
        check_config(demo_config, SCHEMA)
    message = str(error.value)
    assert "'train.batch_tokens' (512)" in message and "'hidden_states.max_seq_len' (2048)" in message
    assert "raise train.batch_tokens to at least 2048" in message
