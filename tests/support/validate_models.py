"""Tiny real models for the validation tests: a servable Llama target (random weights, its own BPE
tokenizer and a Kimi-style thinking template) and an untrained EAGLE-3 draft in the exported format.

The untrained draft is the comparison point of the serve check: a trained draft must beat it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}<|im_system|>system<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{% elif m['role'] == 'user' %}<|im_user|>user<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{% else %}<|im_assistant|>assistant<|im_middle|>{{ m['content'] }}<|im_end|>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|><think>{% endif %}"
)
SPECIALS = [
    "<unk>",
    "<|im_end|>",
    "<|im_system|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_middle|>",
    "<think>",
    "</think>",
]


def write_tokenizer(path: Path, vocab_size: int = 512) -> int:
    """A byte-level BPE trained on a few sentences; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    text = ["I need to compute 12 + 30. The answer is 42.", "What is 7 times 6? Let me think step by step."]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(text * 50, trainer)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|im_end|>",
                "unk_token": "<unk>",
                "chat_template": CHAT_TEMPLATE,
                "model_max_length": 1024,
            }
        )
    )
    return tokenizer.get_vocab_size()


def write_tiny_target(path: Path, seed: int = 0) -> Path:
    """A random 8-layer Llama (hidden 128, 2 heads of 64) that vLLM CPU serves with EAGLE-3."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(path)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=8,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        eos_token_id=1,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}))
    return path


def draft_config(target: dict, draft_vocab_size: int, aux_layer_ids: list[int]) -> dict:
    """config.json of an EAGLE-3 draft for `target` (a target config.json as a dict)."""
    hidden = target["hidden_size"]
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": hidden,
        "intermediate_size": target["intermediate_size"],
        "num_attention_heads": target["num_attention_heads"],
        "num_key_value_heads": target["num_key_value_heads"],
        "head_dim": target.get("head_dim", 64),
        "rms_norm_eps": target.get("rms_norm_eps", 1e-6),
        "rope_theta": 10000.0,
        "max_position_embeddings": target["max_position_embeddings"],
        "hidden_act": "silu",
        "vocab_size": target["vocab_size"],
        "draft_vocab_size": draft_vocab_size,
        "target_hidden_size": hidden,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux_layer_ids, "use_aux_hidden_state": True},
    }


def write_untrained_draft(path: Path, target_dir: Path, draft_vocab_size: int = 256, seed: int = 1) -> Path:
    """A randomly initialised EAGLE-3 draft checkpoint (config.json + model.safetensors)."""
    target = json.loads((target_dir / "config.json").read_text())
    n = target["num_hidden_layers"]
    config = draft_config(target, draft_vocab_size, [2, n // 2, n - 3])
    h, i, hd = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    used = torch.arange(draft_vocab_size, dtype=torch.int64)
    t2d = torch.zeros(target["vocab_size"], dtype=torch.bool)
    t2d[used] = True
    ones = torch.ones(h, dtype=torch.bfloat16)
    tensors = {
        "fc.weight": rand(h, 3 * h),
        "norm.weight": ones.clone(),
        "lm_head.weight": rand(draft_vocab_size, h),
        "midlayer.self_attn.q_proj.weight": rand(q, 2 * h),
        "midlayer.self_attn.k_proj.weight": rand(kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": rand(kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": rand(h, q),
        "midlayer.mlp.gate_proj.weight": rand(i, h),
        "midlayer.mlp.up_proj.weight": rand(i, h),
        "midlayer.mlp.down_proj.weight": rand(h, i),
        "midlayer.input_layernorm.weight": ones.clone(),
        "midlayer.hidden_norm.weight": ones.clone(),
        "midlayer.post_attention_layernorm.weight": ones.clone(),
        "d2t": used - torch.arange(draft_vocab_size),
        "t2d": t2d,
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, str(path / "model.safetensors"))
    return path


def shift_vocab_map(checkpoint: Path) -> None:
    """A wrong vocabulary map: rewrite the checkpoint's d2t in place so that draft id i maps to the
    target id meant for i + 1 (used[i] = i + d2t[i])."""
    tensors = load_file(checkpoint / "model.safetensors")
    if "d2t" not in tensors:
        raise ValueError(f"{checkpoint}: no d2t (the draft vocabulary is the target's): nothing to shift")
    tensors["d2t"] = torch.roll(tensors["d2t"], -1) + 1  # i + d2t'[i] = (i + 1) + d2t[i + 1]
    save_file(tensors, checkpoint / "model.safetensors", metadata={"format": "pt"})
