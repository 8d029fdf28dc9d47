"""Config validation: the demo default is valid; bad configs fail with the key and the fix named."""

from __future__ import annotations

import copy
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


def test_a_training_batch_smaller_than_the_longest_sample_is_refused(demo_config):
    demo_config["train"]["batch_tokens"] = 512
    demo_config["hidden_states"]["max_seq_len"] = 2048
    with pytest.raises(ConfigError) as error:
        check_config(demo_config, SCHEMA)
    message = str(error.value)
    assert "'train.batch_tokens' (512)" in message and "'hidden_states.max_seq_len' (2048)" in message
    assert "raise train.batch_tokens to at least 2048" in message
