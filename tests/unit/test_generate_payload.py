"""The request's sampling from generation.*, and the generation rules' params (rerun triggers): plain
dicts that leave out a key added later while it holds its no-op value."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from eagle3_pipeline.generate.payload import (
    LATER_KEYS,
    PACING_KEYS,
    SHARD_KEYS,
    Sampling,
    sampling_params,
    shard_params,
)
from eagle3_pipeline.settings import GenerationSettings, section

REPO = Path(__file__).resolve().parents[2]

SAMPLING = {
    "max_tokens": 8192,
    "temperature": 0.6,
    "top_p": 0.95,
    "seed": 0,
    "chat_template_kwargs": {},
}


def test_sampling_from_settings_reads_every_sampling_field():
    generation = section(
        GenerationSettings,
        {"max_tokens": 64, "top_k": 20, "chat_template_kwargs": {"thinking": False}, "extra_body": {"x": 1}},
    )
    sampling = Sampling.from_settings(generation, "demo")
    assert sampling == Sampling("demo", 64, 0.6, 0.95, 0, {"thinking": False}, top_k=20, extra_body={"x": 1})
    assert sampling.thinking_off and not Sampling("demo", 64).thinking_off
    with pytest.raises(ValueError, match="extra_body sets \\['seed'\\]"):
        Sampling.from_settings(section(GenerationSettings, {"extra_body": {"seed": 1}}), "demo")


def test_params_leave_out_the_later_keys_at_their_no_op_values():
    assert sampling_params(GenerationSettings()) == SAMPLING
    assert list(sampling_params(GenerationSettings())) == list(SAMPLING)  # the recorded repr's order
    assert shard_params(GenerationSettings()) == SAMPLING  # no pacing, history none left out
    changed = GenerationSettings(top_k=20, extra_body={"x": 1}, history="own", concurrency=2)
    assert sampling_params(changed) == {**SAMPLING, "top_k": 20, "extra_body": {"x": 1}}
    assert shard_params(changed) == {**SAMPLING, "top_k": 20, "extra_body": {"x": 1}, "history": "own"}


def test_a_shard_records_every_key_but_the_pacing():
    fields = {f.name for f in dataclasses.fields(GenerationSettings)}
    assert sorted(SHARD_KEYS + PACING_KEYS) == sorted(fields)


@pytest.mark.parametrize("changes", [{}, {"top_k": 20, "extra_body": {"x": 1}, "history": "own"}])
def test_shard_params_repr_is_the_raw_sections_of_a_config_written_from_config_yaml(changes):
    """Snakemake compares params by repr: a run recorded from the raw section keeps its shards."""
    raw = {**yaml.safe_load((REPO / "config" / "config.yaml").read_text())["generation"], **changes}
    before = {  # the rule's dict comprehension over the raw section before it was typed
        key: value
        for key, value in raw.items()
        if key not in PACING_KEYS and (key not in LATER_KEYS or value != LATER_KEYS[key])
    }
    assert repr(shard_params(section(GenerationSettings, raw))) == repr(before)
