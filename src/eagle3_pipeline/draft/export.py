"""Export the trained draft as an EAGLE-3 checkpoint in the EAGLE/SpecForge format, which vLLM
(vllm/model_executor/models/llama_eagle3.py) and SGLang (srt/models/llama_eagle3.py) load:

    config.json        LlamaForCausalLMEagle3, one layer, draft_vocab_size, target_hidden_size and the
                       auxiliary layer ids, each key in its reader's numbering (below)
    model.safetensors  fc, midlayer.*, norm, lm_head (bf16), d2t (int64), t2d (bool); no embeddings

The auxiliary layers the draft was trained on are written twice, because the engines read different
keys in different numberings (and fall back to their default (2, N/2, N-3) silently):

    eagle_aux_hidden_state_layer_ids (top level)   vLLM: read first by both model runners (V1,
        gpu_model_runner._get_eagle3_aux_layers_from_config; V2, spec_decode/eagle/eagle3_utils), as
        "the input of decoder layer i" = the output of layer i - 1: the shard metadata's aux_layers_vllm.
    eagle_config.eagle_aux_hidden_state_layer_ids  SGLang (model_runner reads it; the model's
        set_eagle3_layers_to_capture captures the input of layer id + 1) and SpecForge (output of
        0-indexed layer id): the outputs' own 0-indexed numbers, vLLM's minus one.

vLLM reads the nested key only for its length (llama_eagle3.py: the fc width), or as ids when the
top-level key is absent; Model Runner V2's other fallback, eagle_config["layer_ids"], is not written
(the top-level key always wins there).

When the draft vocabulary is the whole target vocabulary, d2t and t2d are left out: vLLM then has no
draft_id_to_target_id parameter and refuses a checkpoint carrying d2t.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from eagle3_pipeline import io
from eagle3_pipeline.draft.config import DraftConfig, draft_config_from_target, read_target_config
from eagle3_pipeline.draft.vocab import load_vocab_map

log = logging.getLogger(__name__)

# Every tensor name vLLM's Eagle3LlamaForCausalLM.load_weights maps onto a parameter (midlayer. ->
# layers.0., q/k/v -> qkv_proj, gate/up -> gate_up_proj) and SGLang's loader reads. SGLang skips unknown
# names silently, so a misspelt key would load as an untrained tensor: the export checks the exact set.
WEIGHT_KEYS = (
    "fc.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "norm.weight",
    "lm_head.weight",
)
VOCAB_KEYS = ("d2t", "t2d")


def expected_keys(config: DraftConfig) -> set[str]:
    """The exact tensor names of the exported checkpoint."""
    with_map = config.draft_vocab_size != config.vocab_size
    return set(WEIGHT_KEYS) | (set(VOCAB_KEYS) if with_map else set())


def sglang_layer_ids(aux_layer_ids_vllm: list[int]) -> list[int]:
    """vLLM's ids ("input of layer i") as SGLang/SpecForge number them ("output of 0-indexed layer i").

    Raises:
        ValueError: an id 0 (the embeddings), which SGLang's numbering cannot express.
    """
    if any(i < 1 for i in aux_layer_ids_vllm):
        raise ValueError(f"auxiliary layer ids {aux_layer_ids_vllm} (vLLM numbering) include the embeddings")
    return [int(i) - 1 for i in aux_layer_ids_vllm]


def checkpoint_config(config: DraftConfig, aux_layer_ids_vllm: list[int]) -> dict[str, Any]:
    """config.json for vLLM / SGLang / transformers' LlamaConfig."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": config.hidden_size,
        "target_hidden_size": config.target_hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "max_position_embeddings": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        # vLLM's numbering, read first by both of vLLM's model runners (module docstring)
        "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids_vllm),
        "eagle_config": {
            # SGLang's and SpecForge's: 0-indexed layer outputs (SGLang adds one when capturing)
            "eagle_aux_hidden_state_layer_ids": sglang_layer_ids(aux_layer_ids_vllm),
            "use_aux_hidden_state": True,
        },
    }


def check_tensors(tensors: dict[str, torch.Tensor], config: DraftConfig) -> None:
    """Raise ValueError when names or shapes differ from what the loaders expect."""
    missing, unknown = expected_keys(config) - set(tensors), set(tensors) - expected_keys(config)
    if missing or unknown:
        raise ValueError(f"draft tensors: missing {sorted(missing)}, unknown {sorted(unknown)}")
    h, t = config.hidden_size, config.target_hidden_size
    shapes = {"fc.weight": (h, 3 * t), "lm_head.weight": (config.draft_vocab_size, h), "norm.weight": (h,)}
    shapes["midlayer.self_attn.q_proj.weight"] = (config.num_attention_heads * config.head_dim, 2 * h)
    for name, shape in shapes.items():
        if tuple(tensors[name].shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tensors[name].shape)}, expected {shape}")


def check_fits_target(
    config: DraftConfig, target: dict[str, Any], draft_vocab_size: int, weights: str | Path
) -> None:
    """Raise ValueError when the trained draft does not fit the target or the vocab map (the attention's
    shape, draft.head_dim and the heads, is the draft's own and not compared)."""
    base = draft_config_from_target(
        target, draft_vocab_size, config.head_dim, config.num_attention_heads, config.num_key_value_heads
    )
    if base != config:
        raise ValueError(f"{weights} was trained for another target or vocab map: {config} != {base}")


def aux_layers_from_metadata(metadata_path: str | Path) -> list[int]:
    """The auxiliary layer ids in vLLM's numbering, from a hidden-state shard's metadata."""
    meta = json.loads(Path(metadata_path).read_text())
    if "aux_layers_vllm" not in meta:
        raise ValueError(f"{metadata_path} has no 'aux_layers_vllm'; rebuild the hidden states")
    return [int(i) for i in meta["aux_layers_vllm"]]


def export_checkpoint(
    weights: str | Path,
    vocab_map: str | Path,
    target_config: str | Path,
    hidden_states_metadata: str | Path,
    output_config: str | Path,
    output_weights: str | Path,
) -> None:
    """Write config.json and model.safetensors of the EAGLE-3 checkpoint."""
    d2t, t2d = load_vocab_map(vocab_map)
    with safe_open(str(weights), "pt") as f:
        config = DraftConfig(**json.loads(f.metadata()["draft_config"]))  # the shape it was trained in
        tensors = {k: f.get_tensor(k).to(torch.bfloat16) for k in f.keys()}  # noqa: SIM118
    check_fits_target(config, read_target_config(target_config), len(d2t), weights)
    if config.draft_vocab_size != config.vocab_size:
        tensors |= {"d2t": d2t.to(torch.int64), "t2d": t2d.to(torch.bool)}
    check_tensors(tensors, config)
    io.write_safetensors(tensors, output_weights, metadata={"format": "pt"})
    layer_ids = aux_layers_from_metadata(hidden_states_metadata)
    io.write_json(checkpoint_config(config, layer_ids), output_config, indent=1)
    log.info(
        "exported %d tensors, aux layers %s (vLLM numbering; SGLang's %s), head_dim %d x %d heads, to %s",
        len(tensors),
        layer_ids,
        sglang_layer_ids(layer_ids),
        config.head_dim,
        config.num_attention_heads,
        Path(output_weights).parent,
    )
