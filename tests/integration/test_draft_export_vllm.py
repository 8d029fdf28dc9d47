"""Export, as vLLM's own code reads it (the .venv-vllm interpreter on the exported config.json): the layers
it feeds a draft are the ones the draft was trained on. The rest: tests/unit/test_draft_export.py."""

from __future__ import annotations

import json

import pytest
from support.draft import LAYER_CASES, export_with_layers
from support.engine_rules import vllm_fed_layers


@pytest.mark.vllm
def test_vllm_feeds_the_layers_the_draft_was_trained_on(random_target, tmp_path):
    """vLLM's own code (config parser, V1 runner, Model Runner V2, model default) on the exported
    config.json, for `auto` and non-default layers."""
    for k, (_, outputs) in enumerate(LAYER_CASES):
        export_with_layers(random_target, tmp_path / str(k), outputs)
    cases = [(tmp_path / str(k) / "checkpoint", n) for k, (n, _) in enumerate(LAYER_CASES)]
    for (num_layers, outputs), fed in zip(LAYER_CASES, vllm_fed_layers(cases), strict=True):
        # vLLM captures "the input of layer i" = the output of layer i - 1
        assert fed["v1"] is None or [i - 1 for i in fed["v1"]] == outputs, (num_layers, fed)
        assert [i - 1 for i in fed["v2"]] == outputs, (num_layers, fed)


@pytest.mark.vllm
def test_the_old_nested_only_config_is_served_wrong_by_model_runner_v2(tmp_path):
    """Why the top-level key is written: with the ids only under eagle_config (this project's export
    before), V1 (CPU) reads them but Model Runner V2 (GPU) falls back to its default."""
    checkpoint = tmp_path / "old"
    checkpoint.mkdir()
    nested_only = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64}
    nested_only |= {"num_attention_heads": 2, "num_hidden_layers": 1, "vocab_size": 96}
    nested_only |= {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 7]}}
    (checkpoint / "config.json").write_text(json.dumps(nested_only))
    (fed,) = vllm_fed_layers([(checkpoint, 8)])
    assert fed == {"v1": [1, 3, 7], "v2": [2, 4, 5]}
