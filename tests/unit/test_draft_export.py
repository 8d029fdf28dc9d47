"""Export: key names, shapes, dtypes and config.json as vLLM and SGLang read them."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from support.draft import LAYER_CASES, export_with_layers, trained_weights
from support.engine_rules import sglang_fed_layers

from eagle3_pipeline.draft.export import WEIGHT_KEYS, check_tensors, export_checkpoint, sglang_layer_ids
from eagle3_pipeline.draft.vocab import build_vocab_map


def export(draft_hidden_states, random_target, tmp_path, draft_vocab_size):
    metadata = [p.with_suffix(".json") for p in draft_hidden_states["train"]]
    build_vocab_map(metadata, 96, draft_vocab_size, tmp_path / "vocab.safetensors")
    trained_weights(random_target, draft_vocab_size, tmp_path / "trained.safetensors")
    out = tmp_path / "checkpoint"
    export_checkpoint(
        tmp_path / "trained.safetensors",
        tmp_path / "vocab.safetensors",
        random_target / "config.json",
        metadata[0],
        out / "config.json",
        out / "model.safetensors",
    )
    return json.loads((out / "config.json").read_text()), load_file(out / "model.safetensors")


def test_checkpoint_in_the_eagle_specforge_format(draft_hidden_states, random_target, tmp_path):
    config, tensors = export(draft_hidden_states, random_target, tmp_path, draft_vocab_size=40)
    assert set(tensors) == set(WEIGHT_KEYS) | {"d2t", "t2d"}
    assert not any("embed" in k for k in tensors)
    assert tensors["fc.weight"].shape == (64, 192) and tensors["fc.weight"].dtype == torch.bfloat16
    assert tensors["lm_head.weight"].shape == (40, 64)
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (64, 128)
    assert tensors["midlayer.self_attn.k_proj.weight"].shape == (32, 128)  # 1 kv head of 32
    assert tensors["d2t"].dtype == torch.int64 and tensors["d2t"].shape == (40,)
    assert tensors["t2d"].dtype == torch.bool and tensors["t2d"].shape == (96,)
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (config["num_hidden_layers"], config["vocab_size"], config["draft_vocab_size"]) == (1, 96, 40)
    assert config["target_hidden_size"] == 64 and config["tie_word_embeddings"] is False
    # the fixture's 4-layer target stores outputs of layers [1, 1, 0]: vLLM's key numbers them +1
    # (input of layer i), SGLang's/SpecForge's as they are (0-indexed outputs)
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 2, 1]
    assert config["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": [1, 1, 0],
        "use_aux_hidden_state": True,
    }


def test_config_loads_as_a_llama_config(draft_hidden_states, random_target, tmp_path):
    from transformers import LlamaConfig

    export(draft_hidden_states, random_target, tmp_path, draft_vocab_size=40)
    loaded = LlamaConfig.from_pretrained(tmp_path / "checkpoint")
    assert (loaded.hidden_size, loaded.head_dim, loaded.num_hidden_layers) == (64, 32, 1)
    assert loaded.draft_vocab_size == 40


def test_a_full_vocabulary_draft_carries_no_vocab_map(draft_hidden_states, random_target, tmp_path):
    config, tensors = export(draft_hidden_states, random_target, tmp_path, draft_vocab_size=32000)
    assert set(tensors) == set(WEIGHT_KEYS)  # vLLM rejects d2t when the vocabularies are equal
    assert config["draft_vocab_size"] == config["vocab_size"] == 96


def test_wrong_key_names_are_refused(random_target, tmp_path):
    config = trained_weights(random_target, 40, tmp_path / "trained.safetensors")
    tensors = load_file(tmp_path / "trained.safetensors")
    tensors["layers.0.mlp.up_proj.weight"] = tensors.pop("midlayer.mlp.up_proj.weight")
    tensors |= {"d2t": torch.zeros(40, dtype=torch.int64), "t2d": torch.zeros(96, dtype=torch.bool)}
    with pytest.raises(ValueError, match=r"missing \['midlayer.mlp.up_proj.weight'\]"):
        check_tensors(tensors, config)


# (target layers N, the 0-indexed layer outputs the draft was trained on): `auto`, and others
@pytest.mark.parametrize(("num_layers", "outputs"), LAYER_CASES)
def test_sglang_captures_the_layers_the_draft_was_trained_on(random_target, tmp_path, num_layers, outputs):
    config = export_with_layers(random_target, tmp_path, outputs)
    # SGLang captures the input of layer id + 1, i.e. the output of layer id
    assert [i - 1 for i in sglang_fed_layers(config, num_layers)] == outputs


def test_sglang_default_equals_auto_only_for_the_default_layers():
    # what SGLang would feed a checkpoint without the nested key: right for `auto`, wrong otherwise
    assert [i - 1 for i in sglang_fed_layers({}, 8)] == [1, 3, 4]
    assert sglang_layer_ids([2, 4, 5]) == [1, 3, 4]
    with pytest.raises(ValueError, match="embeddings"):
        sglang_layer_ids([0, 4, 5])
