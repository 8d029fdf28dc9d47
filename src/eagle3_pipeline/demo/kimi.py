"""The Kimi-family demo target: Kimi-K2.5's family in miniature, built and fitted offline.

A DeepseekV3 text model (multi-head latent attention with a q LoRA, YaRN rope, routed experts beside one
shared expert under `noaux_tc` sigmoid routing, the first layer dense) inside Kimi-K2.5's multimodal
wrapper, as the real checkpoint ships: config.json is a `KimiK25ForConditionalGeneration` (model_type
kimi_k25) whose `text_config` is the DeepseekV3, the weights are named `language_model.*`, and a
preprocessor_config.json describes the (absent) vision side. vLLM 0.32 registers the wrapper
(models/kimi_k25.py) and serves its text model with `--language-model-only`: no vision tower is built,
but the wrapper's processing info still reads preprocessor_config.json ("Can't load image processor ...
containing a preprocessor_config.json file" without it).

The tokenizer, chat template (it thinks) and fit are the Llama demo's (demo/tokenizer.py, demo/fit.py);
only the model differs. vLLM's CPU MLA takes kv_lora_rank + qk_rope_head_dim = 576 alone ("Head dimension
96 is not supported by MLA"), which fixes the latent's width; the rest is as small as the fit allows.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, GenerationConfig

from eagle3_pipeline.demo.fit import RECIPE, FitOptions, build_examples, fit
from eagle3_pipeline.demo.tokenizer import save_tokenizer, train_tokenizer
from eagle3_pipeline.settings import DemoSettings

logger = logging.getLogger(__name__)

KIMI_SERVED_MODEL_NAME = "eagle3-demo-kimi-target"
KIMI_ARCHITECTURE = "KimiK25ForConditionalGeneration"  # vLLM 0.32: models/kimi_k25.py
# The text model (Kimi-K2.5: 61 layers, hidden 7168, 64 heads, q_lora 1536, kv_lora 512, nope 128, rope 64,
# v 128, 384 routed experts of 2048 + 1 shared, top 8 of 8 groups (topk_group 4), first layer dense,
# YaRN factor 64 from 4,096). Four layers: the fit is the demo's longest stage on 2 cores (a step of this
# MoE costs several of the Llama demo's), and vLLM's ids 1, 2, 3 are three distinct auxiliary layers.
KIMI_TEXT_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 384,  # the dense first layer
    "moe_intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "q_lora_rank": 64,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 64,
    "v_head_dim": 64,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "n_group": 2,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "max_position_embeddings": 4096,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
# Kimi-K2.5's vision side, as small as its config class takes: described, never built (--language-model-only)
VISION_CONFIG = {
    "model_type": "kimi_k25_vision",
    "patch_size": 14,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "hidden_size": 64,
    "intermediate_size": 128,
    "merge_kernel_size": [2, 2],
}
# Kimi-K2.5's preprocessor_config.json (media_proc_cfg: what vLLM's KimiK25FusedVisionProcessor reads)
PREPROCESSOR_CONFIG = {
    "image_processor_type": "KimiK25VisionProcessor",
    "media_proc_cfg": {
        "in_patch_limit": 16384,
        "patch_size": 14,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_kernel_size": 2,
        "fixed_output_tokens": None,
        "patch_limit_on_one_side": 512,
        "in_patch_limit_each_frame": 4096,
        "in_patch_limit_video": None,
        "sample_fps": 2.0,
        "max_num_frames_each_video": None,
        "temporal_merge_kernel_size": 4,
        "timestamp_mode": "hh:mm:ss.fff",
        "config_type": "image",
    },
}


def text_config(tokenizer) -> DeepseekV3Config:
    """The DeepseekV3 text model's config for ``tokenizer``'s vocabulary and special ids."""
    return DeepseekV3Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **KIMI_TEXT_SHAPE,
    )


def wrapper_config(text: DeepseekV3Config) -> dict:
    """Kimi-K2.5's config.json around ``text``: the multimodal class, the text model as text_config."""
    text_dict = text.to_dict() | {"architectures": ["DeepseekV3ForCausalLM"]}
    media = text.pad_token_id  # no media token in this vocabulary: never sent (text only)
    return {
        "architectures": [KIMI_ARCHITECTURE],
        "model_type": "kimi_k25",
        "text_config": text_dict,
        "vision_config": VISION_CONFIG,
        "projection_hidden_size": VISION_CONFIG["hidden_size"],
        "image_token_id": media,
        "video_token_id": media,
        "media_placeholder_token_id": media,
        "bos_token_id": text.bos_token_id,
        "eos_token_id": text.eos_token_id,
        "pad_token_id": text.pad_token_id,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def save_wrapped(model: DeepseekV3ForCausalLM, out_dir: Path) -> None:
    """Save ``model`` as Kimi-K2.5's checkpoint is laid out: bf16 weights named ``language_model.*`` (per
    expert, the legacy layout transformers' save_pretrained writes back), each MoE layer's
    ``mlp.gate.e_score_correction_bias`` (noaux_tc's; kept in float32 as the real checkpoint does), and the
    wrapper's config.json."""
    scratch = out_dir / ".text"
    model.to(torch.bfloat16).save_pretrained(scratch)
    tensors = {f"language_model.{k}": v for k, v in load_file(scratch / "model.safetensors").items()}
    config = model.config
    for layer in range(config.first_k_dense_replace, config.num_hidden_layers):
        key = f"language_model.model.layers.{layer}.mlp.gate.e_score_correction_bias"
        if key not in tensors:
            bias = model.model.layers[layer].mlp.gate.e_score_correction_bias
            tensors[key] = bias.detach().float().contiguous()
    for stale in scratch.iterdir():
        stale.unlink()
    scratch.rmdir()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(wrapper_config(config), indent=2) + "\n")
    (out_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2) + "\n")


def build_kimi_target(
    rows: list[dict],
    texts: list[str],
    out_dir: Path,
    demo: DemoSettings,
    options: FitOptions = RECIPE,
) -> dict[str, float]:
    """Train the tokenizer on ``texts``, fit the Kimi-family model on ``rows`` as the Llama demo target is
    fitted (demo/fit.py), and save the wrapped checkpoint, tokenizer and generation_config.json."""
    tokenizer = train_tokenizer(texts)
    examples = build_examples(rows, tokenizer, demo.seed)
    logger.info("%d examples, %d tokens", len(examples), sum(len(ids) for ids, _ in examples))
    torch.manual_seed(demo.seed)
    model = DeepseekV3ForCausalLM(text_config(tokenizer))
    figures = fit(model, examples, tokenizer.pad_token_id, demo, options)
    logger.info("fit: %s", figures)
    save_wrapped(model, out_dir)
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    ).save_pretrained(out_dir)
    save_tokenizer(tokenizer, out_dir)
    params = sum(p.numel() for p in model.parameters())
    (out_dir / "fit.json").write_text(
        json.dumps({**figures, "examples": len(examples), "parameters": params}, indent=2) + "\n"
    )
    return figures
