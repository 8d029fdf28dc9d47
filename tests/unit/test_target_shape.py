"""TargetShape: the target's config.json parsed in one place (a VL wrapper's text_config unwrapped), and
the auxiliary layers chosen once and renumbered for each engine."""

from __future__ import annotations

import hashlib
import json

import pytest
from support.workflow import KIMI_TARGET_CONFIG

from eagle3_pipeline.target_shape import (
    AuxLayerError,
    TargetShape,
    aux_layers,
    engine_layer_ids,
    sglang_layer_ids,
    vllm_layer_ids,
)

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "vocab_size": 100,
    "rms_norm_eps": 1e-5,
}


def test_load_reads_a_folder_or_the_file_and_keeps_its_digest(tmp_path):
    raw = json.dumps(LLAMA).encode()
    (tmp_path / "config.json").write_bytes(raw)
    from_folder, from_file = TargetShape.load(tmp_path), TargetShape.load(tmp_path / "config.json")
    assert from_folder == from_file
    assert from_folder.sha256 == hashlib.sha256(raw).hexdigest()
    assert from_folder.source == str(tmp_path / "config.json")
    with pytest.raises(OSError):
        TargetShape.load(tmp_path / "absent")


def test_a_plain_config_is_its_own_language_model():
    shape = TargetShape.from_json(LLAMA)
    assert not shape.is_vl_wrapper and not shape.has_remote_code
    assert (shape.num_layers, shape.hidden_size, shape.rms_norm_eps) == (8, 64, 1e-5)
    assert shape.model_type == "llama" and shape.architectures == ["LlamaForCausalLM"]
    assert shape.stated_shape() == (8, 64, 100)
    assert shape.draft_fields() == LLAMA


def test_a_vl_wrapper_is_read_through_its_text_config():
    shape = TargetShape.from_json(KIMI_TARGET_CONFIG)
    assert shape.is_vl_wrapper and shape.model_type == "deepseek_v3"  # the text model's, not the wrapper's
    assert (shape.num_layers, shape.hidden_size) == (61, 7168)
    assert shape.stated_shape() == (61, 7168, 163840)
    assert shape.architectures == ["KimiK25ForConditionalGeneration"]  # the wrapper's, as vLLM loads it
    # the wrapper's model_type stands in where the text model names none
    text = {k: v for k, v in KIMI_TARGET_CONFIG["text_config"].items() if k != "model_type"}
    assert TargetShape.from_json({**KIMI_TARGET_CONFIG, "text_config": text}).model_type == "kimi_k25"


def test_what_is_not_stated_is_refused_or_left_open():
    empty = TargetShape.from_json({"vocab_size": 3})
    assert empty.num_layers is None and empty.rms_norm_eps is None
    with pytest.raises(ValueError, match="no hidden_size"):
        empty.hidden_size  # noqa: B018
    with pytest.raises(ValueError, match=r"lacks \['hidden_size', 'num_attention_heads'\]"):
        empty.draft_fields()
    # a text_config beside a top-level hidden_size: which one is the language model's is AutoConfig's call
    both = {**LLAMA, "text_config": {"hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 10}}
    assert TargetShape.from_json(both).stated_shape() is None
    assert TargetShape.from_json({**LLAMA, "vision_config": {"hidden_size": 3}}).stated_shape() is None


def test_aux_layers_are_chosen_once_and_renumbered_for_each_engine():
    assert aux_layers("auto", 8) == [1, 3, 4]
    assert TargetShape.from_json(KIMI_TARGET_CONFIG).aux_layers(["auto"]) == [1, 29, 57]
    assert aux_layers(["5", "1", "3"], 8) == [1, 3, 5]
    assert vllm_layer_ids([1, 29, 57]) == [2, 30, 58]  # the input of layer l + 1
    assert engine_layer_ids([1, 29, 57], 61) == [2, 30, 58, 61]  # and the last layer, before the norm
    assert sglang_layer_ids(vllm_layer_ids([1, 29, 57])) == [1, 29, 57]
    with pytest.raises(ValueError, match="embeddings"):
        sglang_layer_ids([0, 4, 5])
    for bad in ([1, 1, 3], [1, 3], [1, 3, 8], ["x", 1, 2]):
        with pytest.raises(AuxLayerError, match="hidden_states.layers"):
            aux_layers(bad, 8)
    with pytest.raises(AuxLayerError, match=">= 5 decoder layers"):
        aux_layers("auto", 4)
