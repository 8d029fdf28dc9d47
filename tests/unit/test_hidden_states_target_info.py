"""plan.target_info reads the target's shape from config.json without importing transformers (an
extraction client's planning was mostly that import while its engine waited, issue 37 item 5), with
the values AutoConfig gives, and falls back to AutoConfig where the JSON does not state them plainly."""

from __future__ import annotations

import json
import sys

from support.workflow import KIMI_TARGET_CONFIG
from transformers import AutoConfig

from eagle3_pipeline.hidden_states import plan
from eagle3_pipeline.target_shape import TargetShape


def _stated(config: dict) -> tuple[int, int, int] | None:
    return TargetShape.from_json(config).stated_shape()


def test_the_shape_comes_from_the_json_with_autoconfigs_values_and_no_transformers(hs_target, monkeypatch):
    config = AutoConfig.from_pretrained(str(hs_target))
    expected = (config.num_hidden_layers, config.hidden_size, config.vocab_size)
    monkeypatch.setitem(sys.modules, "transformers", None)  # an import of it would raise
    info = plan.target_info(hs_target)
    assert (info.num_layers, info.hidden_size, info.vocab_size) == expected
    assert len(info.config_sha) == 64


def test_a_vl_wrapper_states_its_language_models_shape_in_text_config(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps(KIMI_TARGET_CONFIG))
    monkeypatch.setitem(sys.modules, "transformers", None)
    info = plan.target_info(tmp_path, trust_remote_code=True)
    assert (info.num_layers, info.hidden_size, info.vocab_size) == (61, 7168, 163840)


def test_what_the_json_does_not_state_plainly_is_left_to_autoconfig():
    shape = {"num_hidden_layers": 2, "hidden_size": 64, "vocab_size": 100}
    assert _stated(shape) == (2, 64, 100)
    assert _stated({"n_layer": 2, "n_embd": 64, "vocab_size": 100}) is None  # renamed keys
    assert _stated({**shape, "hidden_size": None}) is None
    assert _stated({**shape, "num_hidden_layers": True}) is None
    # two nested configs that could be the language model's: AutoConfig's get_text_config decides
    vl = {"text_config": shape, "vision_config": {"hidden_size": 32}}
    assert _stated(vl) is None
