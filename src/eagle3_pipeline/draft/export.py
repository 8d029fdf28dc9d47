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

EAGLE-3.1's options (draft.norm_before_fc, draft.fc_norm, draft.norm_output) are written at the top level,
where vLLM's llama_eagle3.py reads them, with their tensors (input_norm.weight; fc_norm.{0,1,2}.weight).

Beside it, `speculators/` holds the same tensors in vllm-project/speculators' self-describing format
(speculators 0.9: Eagle3SpeculatorConfig, the layout its Eagle-3 converter writes), which `vllm serve
<folder>` runs with no flags (vllm/transformers_utils/config.py, maybe_override_with_speculators: the
verifier and the speculative config come from the folder):

    config.json        speculators_model_type eagle3; speculators_config (the verifier by name_or_path,
                       one greedy proposal method of validate.num_speculative_tokens tokens);
                       transformer_layer_config (the draft layer as a LlamaConfig); draft_vocab_size,
                       target_hidden_size, eagle_aux_hidden_state_layer_ids (vLLM's numbering, which
                       speculators shares: speculators/models/utils.py resolve_target_layer_ids) and the
                       norm flags, norm_before_residual written explicitly: vLLM's speculators reader
                       defaults it to true (transformers_utils/configs/speculators/algos.py), this draft
                       adds the residual before hidden_norm (false)
    model.safetensors  midlayer.* renamed layers.0.*, everything else as above

An MLA draft (draft.architecture deepseek_mla) is exported as vLLM 0.32's Eagle3DeepseekV3ForCausalLM
(the DeepseekV3/Kimi family's name; vLLM's registry maps it and Eagle3DeepseekV2ForCausalLM onto the
one class Eagle3DeepseekV2ForCausalLM, models/deepseek_eagle3.py): model_type
deepseek_v2 (deepseek_v3 would be rewritten by vLLM's SpeculativeConfig.hf_config_override into the MTP
path), the target's MLA ranks, head sizes and rope scaling, no MoE keys (a null n_routed_experts is
refused by the config class; the draft's MLP is dense), and midlayer.self_attn.{q_a_proj, q_a_layernorm,
q_b_proj (or q_proj without a q LoRA), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}, the first
two over 2H (vLLM fuses q_a_proj and kv_a_proj_with_mqa into fused_qkv_a_proj). draft.norm_before_fc
has no tensor there (no input_norm) and is refused at config time. The speculators format has no MLA
layer (speculators 0.9's Eagle3 builds llama or qwen3 layers, and vLLM 0.32's speculators reader maps
only those: "Unsupported model_type ... for Eagle3 speculator"): `speculators_config` refuses an MLA
draft, and export_checkpoint writes in speculators/ a config.json that says so (SPECULATORS_REFUSAL)
and a model.safetensors without tensors, so that the rule's outputs exist and nothing loads them.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from eagle3_pipeline import io
from eagle3_pipeline.draft.vocab import load_vocab_map
from eagle3_pipeline.draft_config import (
    NUM_AUX_LAYERS,
    DraftConfig,
    draft_config_from_target,
    read_target_config,
)
from eagle3_pipeline.target_shape import sglang_layer_ids

# the vLLM names this module relies on (vllm_compat.py checks them in each supported release's wheel)
VLLM_NAMES = (
    ("literal", "vllm/model_executor/models/registry.py", "LlamaForCausalLMEagle3"),
    ("literal", "vllm/model_executor/models/registry.py", "Eagle3DeepseekV2ForCausalLM"),
    ("literal", "vllm/model_executor/models/registry.py", "Eagle3DeepseekV3ForCausalLM"),
    ("key", "vllm/model_executor/models/", "eagle_aux_hidden_state_layer_ids"),
    ("key", "vllm/model_executor/models/", "draft_vocab_size"),
    ("key", "vllm/model_executor/models/", "target_hidden_size"),
    ("key", "vllm/model_executor/models/", "norm_before_residual"),
    ("key", "vllm/model_executor/models/", "norm_before_fc"),
    ("key", "vllm/model_executor/models/", "fc_norm"),
    ("key", "vllm/model_executor/models/", "norm_output"),
    ("key", "vllm/model_executor/models/", "d2t"),
    ("key", "vllm/model_executor/models/", "t2d"),
    ("key", "vllm/transformers_utils/configs/speculators/", "speculators_model_type"),
    ("key", "vllm/transformers_utils/configs/speculators/", "speculators_config"),
    ("key", "vllm/transformers_utils/", "verifier"),
    ("key", "vllm/transformers_utils/", "name_or_path"),
    ("key", "vllm/transformers_utils/configs/speculators/", "proposal_methods"),
    ("key", "vllm/transformers_utils/configs/speculators/", "speculative_tokens"),
    ("key", "vllm/transformers_utils/configs/speculators/", "transformer_layer_config"),
    ("key", "vllm/transformers_utils/configs/speculators/", "norm_before_residual"),
    ("literal", "vllm/transformers_utils/configs/speculators/", "eagle3"),
    ("name", "vllm.transformers_utils.config", "maybe_override_with_speculators"),
)

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
# The MLA draft's layer (vLLM's Eagle3DeepseekV3ForCausalLM; module docstring): the same fc, norms, MLP
# and head, MLA projections instead of q/k/v/o. The q LoRA's three tensors, or q_proj without it.
MLA_ATTENTION_KEYS = tuple(
    f"midlayer.self_attn.{name}.weight"
    for name in ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj")
)
MLA_Q_KEYS = {
    True: tuple(f"midlayer.self_attn.{name}.weight" for name in ("q_a_proj", "q_a_layernorm", "q_b_proj")),
    False: ("midlayer.self_attn.q_proj.weight",),
}
MLA_ARCHITECTURE = "Eagle3DeepseekV3ForCausalLM"
SPECULATORS_REFUSAL = (
    "no speculators-format checkpoint for an MLA draft: speculators 0.9's Eagle3 builds llama or qwen3 "
    "decoder layers only, and vLLM 0.32's speculators reader refuses other model types (\"Unsupported "
    'model_type deepseek_v2 for Eagle3 speculator"); serve draft/checkpoint/ with --speculative-config'
)
NORM_KEYS = {  # EAGLE-3.1: the tensors each option adds (names of vLLM's and speculators' loaders)
    "norm_before_fc": ("input_norm.weight",),
    "fc_norm": tuple(f"fc_norm.{i}.weight" for i in range(NUM_AUX_LAYERS)),
    "norm_output": (),
}
SPECULATORS_VERSION = "0.9.0"  # the speculators release whose layout speculators_config() writes


def expected_keys(config: DraftConfig) -> set[str]:
    """The exact tensor names of the exported checkpoint."""
    with_map = config.draft_vocab_size != config.vocab_size
    norms = {key for option, keys in NORM_KEYS.items() if getattr(config, option) for key in keys}
    return layer_keys(config) | (set(VOCAB_KEYS) if with_map else set()) | norms


def layer_keys(config: DraftConfig) -> set[str]:
    """The weight names of the draft's architecture (WEIGHT_KEYS, or its MLA counterpart)."""
    if config.architecture != "deepseek_mla":
        return set(WEIGHT_KEYS)
    llama_attention = {k for k in WEIGHT_KEYS if k.startswith("midlayer.self_attn.")}
    mla = set(MLA_ATTENTION_KEYS) | set(MLA_Q_KEYS[bool(config.q_lora_rank)])
    return (set(WEIGHT_KEYS) - llama_attention) | mla


def norm_flags(config: DraftConfig) -> dict[str, bool]:
    """The EAGLE-3.1 options under the names vLLM and speculators read, and norm_before_residual: false,
    the residual this draft adds (model.py) and the one speculators' and vLLM's defaults disagree on."""
    return {"norm_before_residual": False} | {option: bool(getattr(config, option)) for option in NORM_KEYS}


def checkpoint_config(config: DraftConfig, aux_layer_ids_vllm: list[int]) -> dict[str, Any]:
    """config.json for vLLM / SGLang / transformers' LlamaConfig (DeepseekV2Config for an MLA draft)."""
    llama = _llama_checkpoint_config(config, aux_layer_ids_vllm)
    return llama if config.architecture != "deepseek_mla" else mla_checkpoint_config(config, llama)


def mla_checkpoint_config(config: DraftConfig, llama: dict[str, Any]) -> dict[str, Any]:
    """The Llama config.json turned into vLLM's Eagle3DeepseekV3ForCausalLM's (module docstring): the
    auxiliary ids, vocabulary, norms and widths are the same keys."""
    # Llama-only keys out; the rope goes in rope_scaling (with rope_theta), which transformers 4 and 5 read
    mla = {k: v for k, v in llama.items() if k not in ("attention_bias", "mlp_bias", "rope_parameters")}
    return mla | {
        "architectures": [MLA_ARCHITECTURE],
        "model_type": "deepseek_v2",
        "q_lora_rank": config.q_lora_rank,
        "kv_lora_rank": config.kv_lora_rank,
        "qk_nope_head_dim": config.qk_nope_head_dim,
        "qk_rope_head_dim": config.qk_rope_head_dim,
        "v_head_dim": config.v_head_dim,
        "rope_scaling": dict(config.rope_scaling) if config.rope_scaling else None,
    }


def _llama_checkpoint_config(config: DraftConfig, aux_layer_ids_vllm: list[int]) -> dict[str, Any]:
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
        **norm_flags(config),  # vLLM reads them top level
    }


def layer_config(config: DraftConfig) -> dict[str, Any]:
    """speculators' transformer_layer_config: the draft's decoder layer as a transformers LlamaConfig."""
    return {
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


def speculators_config(
    config: DraftConfig,
    aux_layer_ids_vllm: list[int],
    verifier: str,
    verifier_architectures: list[str],
    speculative_tokens: int,
) -> dict[str, Any]:
    """config.json of the speculators-format checkpoint (module docstring).

    Raises:
        ValueError: an MLA draft, which the speculators format cannot hold (SPECULATORS_REFUSAL).
    """
    if config.architecture == "deepseek_mla":
        raise ValueError(SPECULATORS_REFUSAL)
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": int(speculative_tokens),
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
        },
        "transformer_layer_config": layer_config(config),
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids_vllm),
        **norm_flags(config),
        "embed_requires_grad": False,
        "dtype": "bfloat16",
    }


def speculators_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The EAGLE checkpoint's tensors under speculators' names (its converter renames midlayer.)."""
    return {name.replace("midlayer.", "layers.0.", 1): t for name, t in tensors.items()}


def check_tensors(tensors: dict[str, torch.Tensor], config: DraftConfig) -> None:
    """Raise ValueError when names or shapes differ from what the loaders expect."""
    missing, unknown = expected_keys(config) - set(tensors), set(tensors) - expected_keys(config)
    if missing or unknown:
        raise ValueError(f"draft tensors: missing {sorted(missing)}, unknown {sorted(unknown)}")
    h, t = config.hidden_size, config.target_hidden_size
    shapes = {"fc.weight": (h, NUM_AUX_LAYERS * t), "lm_head.weight": (config.draft_vocab_size, h)}
    shapes["norm.weight"] = (h,)
    shapes |= attention_shapes(config)
    shapes |= {"input_norm.weight": (NUM_AUX_LAYERS * t,)} if config.norm_before_fc else {}
    shapes |= {name: (t,) for name in NORM_KEYS["fc_norm"]} if config.fc_norm else {}
    for name, shape in shapes.items():
        if tuple(tensors[name].shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tensors[name].shape)}, expected {shape}")


def attention_shapes(config: DraftConfig) -> dict[str, tuple[int, ...]]:
    """Shapes of the attention's input projections (the 2H-wide ones the loaders size from the config)."""
    h2, heads = 2 * config.hidden_size, config.num_attention_heads
    if config.architecture != "deepseek_mla":
        return {"midlayer.self_attn.q_proj.weight": (heads * config.head_dim, h2)}
    prefix, latent = "midlayer.self_attn.", config.kv_lora_rank
    shapes = {
        f"{prefix}kv_a_proj_with_mqa.weight": (latent + config.qk_rope_head_dim, h2),
        f"{prefix}kv_b_proj.weight": (heads * (config.qk_nope_head_dim + config.v_head_dim), latent),
        f"{prefix}o_proj.weight": (config.hidden_size, heads * config.v_head_dim),
    }
    if config.q_lora_rank:
        shapes[f"{prefix}q_a_proj.weight"] = (config.q_lora_rank, h2)
        shapes[f"{prefix}q_b_proj.weight"] = (heads * config.qk_head_dim, config.q_lora_rank)
    else:
        shapes[f"{prefix}q_proj.weight"] = (heads * config.qk_head_dim, h2)
    return shapes


def check_fits_target(
    config: DraftConfig, target: dict[str, Any], draft_vocab_size: int, weights: str | Path
) -> None:
    """Raise ValueError when the trained draft does not fit the target or the vocab map (the attention's
    shape, draft.head_dim and the heads, is the draft's own and not compared)."""
    base = draft_config_from_target(
        target,
        draft_vocab_size,
        config.head_dim,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.norm_before_fc,
        config.fc_norm,
        config.norm_output,
        config.architecture,
    )
    if base != config:
        raise ValueError(f"{weights} was trained for another target or vocab map: {config} != {base}")


def aux_layers_from_metadata(metadata_path: str | Path) -> list[int]:
    """The auxiliary layer ids in vLLM's numbering, from a hidden-state shard's metadata."""
    meta = json.loads(Path(metadata_path).read_text())
    if "aux_layers_vllm" not in meta:
        raise ValueError(f"{metadata_path} has no 'aux_layers_vllm'; rebuild the hidden states")
    return [int(i) for i in meta["aux_layers_vllm"]]


# A folder of the hub's cache (huggingface_hub's layout): models--ORG--NAME/snapshots/REVISION
HUB_CACHE_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/[^/]+/?$")


def hub_id_of(target: str | Path) -> str | None:
    """The hub repository id of a target folder that is a hub cache snapshot, else None."""
    match = HUB_CACHE_SNAPSHOT.search(Path(target).as_posix())
    return f"{match['org']}/{match['name']}" if match else None


def verifier_name(target: str | Path, hub_id: str | None = None) -> str:
    """The verifier as speculators_config names it: `hub_id` (target.hub_id), else the target folder's
    own hub id when it is a hub cache snapshot, else the folder, absolute.

    vLLM 0.33 and later serve the folder alone (`vllm serve FOLDER`) only with a hub id there
    (transformers_utils/config.py, maybe_override_with_speculators: "Speculators verifier must name a
    remote model repository"); with a local path the folder is served by the explicit form, `vllm serve
    TARGET --speculative-config '{"model": FOLDER, ...}'` (README), on every release.
    """
    found = hub_id or hub_id_of(target)
    if found:
        return found
    path = Path(target)
    log.warning(
        "the speculators folder names the target by its local path %s: vLLM >= 0.33 serves it only as "
        '`vllm serve %s --speculative-config \'{"method": "eagle3", "model": FOLDER, ...}\'`; set '
        "target.hub_id to serve it as `vllm serve FOLDER`",
        path.resolve() if path.exists() else path,
        path.resolve() if path.exists() else path,
    )
    return str(path.resolve()) if path.exists() else str(target)


def write_speculators_refusal(folder: Path) -> None:
    """speculators/ for an MLA draft: a config.json saying why there is no checkpoint, and no tensors."""
    log.warning(SPECULATORS_REFUSAL)
    io.write_safetensors({}, folder / "model.safetensors", metadata={"format": "pt"})
    io.write_json(
        {"speculators_model_type": None, "error": SPECULATORS_REFUSAL}, folder / "config.json", indent=1
    )


def export_checkpoint(
    weights: str | Path,
    vocab_map: str | Path,
    target_config: str | Path,
    hidden_states_metadata: str | Path,
    output_config: str | Path,
    output_weights: str | Path,
    speculators_dir: str | Path | None = None,
    verifier: str | None = None,
    speculative_tokens: int = 3,
) -> None:
    """Write config.json and model.safetensors of the EAGLE-3 checkpoint, and with `speculators_dir` the
    same draft in speculators' format there, naming `verifier` (a hub id; default: `verifier_name` of
    the target's folder).

    Raises:
        ValueError: the trained draft does not fit the target, the vocab map or the loaders.
    """
    d2t, t2d = load_vocab_map(vocab_map)
    with safe_open(str(weights), "pt") as f:
        config = DraftConfig(**json.loads(f.metadata()["draft_config"]))  # the shape it was trained in
        tensors = {k: f.get_tensor(k).to(torch.bfloat16) for k in f.keys()}  # noqa: SIM118
    target = read_target_config(target_config)
    check_fits_target(config, target, len(d2t), weights)
    if config.draft_vocab_size != config.vocab_size:
        tensors |= {"d2t": d2t.to(torch.int64), "t2d": t2d.to(torch.bool)}
    check_tensors(tensors, config)
    io.write_safetensors(tensors, output_weights, metadata={"format": "pt"})
    layer_ids = aux_layers_from_metadata(hidden_states_metadata)
    io.write_json(checkpoint_config(config, layer_ids), output_config, indent=1)
    if speculators_dir is not None and config.architecture == "deepseek_mla":
        write_speculators_refusal(Path(speculators_dir))
    elif speculators_dir is not None:
        folder = Path(target_config)
        verifier = verifier_name(folder if folder.is_dir() else folder.parent, verifier)
        architectures = target.get("architectures") or ["LlamaForCausalLM"]
        spec = speculators_config(config, layer_ids, verifier, architectures, speculative_tokens)
        out, metadata = Path(speculators_dir), {"format": "pt"}
        io.write_safetensors(speculators_tensors(tensors), out / "model.safetensors", metadata=metadata)
        io.write_json(spec, out / "config.json", indent=1)
    log.info(
        "exported %d tensors, aux layers %s (vLLM numbering; SGLang's %s), head_dim %d x %d heads, to %s",
        len(tensors),
        layer_ids,
        sglang_layer_ids(layer_ids),
        config.head_dim,
        config.num_attention_heads,
        Path(output_weights).parent,
    )
