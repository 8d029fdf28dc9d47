"""A draft checkpoint's config.json, read in one place (draft_config.read_checkpoint_config), in both
formats the pipeline writes and reads: EAGLE (draft/export.py's top folder) and speculators."""

from __future__ import annotations

import json

import pytest

from eagle3_pipeline.draft_config import DraftConfig, read_checkpoint_config

LAYER = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "vocab_size": 500,
}


def test_an_eagle_checkpoint_states_its_shape_and_layers_at_the_top(tmp_path):
    stated = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **LAYER,
        "draft_vocab_size": 100,
        "eagle_aux_hidden_state_layer_ids": [1, 3, 5],
    }
    (tmp_path / "config.json").write_text(json.dumps(stated))
    config = read_checkpoint_config(tmp_path)
    assert not config.speculators and not config.mla and config.layer == stated
    assert config.aux_layer_ids == [1, 3, 5]
    draft = config.draft_config()
    assert isinstance(draft, DraftConfig) and draft.draft_vocab_size == 100
    assert draft.target_hidden_size == 64  # unstated: the draft's own hidden size, as its readers take it


def test_a_speculators_checkpoint_keeps_its_layer_apart_and_an_mla_draft_is_known_by_its_name(tmp_path):
    stated = {
        "architectures": ["Eagle3DeepseekV3ForCausalLM"],
        "speculators_config": {"algorithm": "eagle3"},
        "transformer_layer_config": LAYER,
    }
    (tmp_path / "config.json").write_text(json.dumps(stated))
    config = read_checkpoint_config(tmp_path)
    assert config.speculators and config.mla and config.layer == LAYER
    assert config.aux_layer_ids is None  # unstated


def test_a_folder_without_a_config_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "config.json")):
        read_checkpoint_config(tmp_path)
