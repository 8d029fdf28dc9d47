"""A tiny Kimi-family target built offline (a random DeepseekV3: MLA with YaRN rope, routed and shared
experts under `noaux_tc` sigmoid routing) that vLLM's CPU build serves with an MLA EAGLE-3 draft, and
hidden-state shards of its own greedy continuations (transformers), in the pipeline's storage format.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from support.draft import save_shard
from support.validate_models import write_tokenizer

# vLLM CPU's MLA takes kv_lora_rank + qk_rope_head_dim = 576 (96 was refused); 4 layers: aux ids 1, 2, 3
MLA_TARGET = {
    "hidden_size": 256,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 128,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "max_position_embeddings": 1024,
    "rope_theta": 10000.0,
    # Kimi-K2's kind of rope scaling (factor 64 from 4,096 there): YaRN, mscale on both
    "rope_scaling": {
        "type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 256,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "tie_word_embeddings": False,
}
AUX_LAYERS = [0, 1, 2]  # 0-indexed outputs; vLLM's 1, 2, 3 (its default (2, 2, 1) repeats at 4 layers)


def write_mla_target(path: Path, seed: int = 0) -> Path:
    """Random DeepseekV3ForCausalLM weights (bf16), a small BPE tokenizer with a thinking template, and
    each MoE layer's e_score_correction_bias (noaux_tc needs it; save_pretrained leaves it out)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(path)
    torch.manual_seed(seed)
    config = DeepseekV3Config(vocab_size=vocab, eos_token_id=1, bos_token_id=None, **MLA_TARGET)
    model = DeepseekV3ForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():  # a spread of logits: greedy text that is not one token repeated
        model.lm_head.weight.normal_(0, 0.2)
    model.save_pretrained(path)
    weights = path / "model.safetensors"
    tensors = load_file(weights)
    for layer in range(config.first_k_dense_replace, config.num_hidden_layers):
        tensors[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"] = torch.zeros(
            config.n_routed_experts, dtype=torch.float32
        )
    save_file(tensors, str(weights), metadata={"format": "pt"})
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}))
    return path


def load_target(path: Path) -> torch.nn.Module:
    from transformers import DeepseekV3ForCausalLM

    return DeepseekV3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.no_grad()
def greedy_sequences(model: torch.nn.Module, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Each prompt with the target's greedy continuation (eos not stopping it: lengths stay fixed)."""
    ids = torch.tensor(prompts)  # prompts of one length
    kwargs = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    out = model.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=0, **kwargs)
    return out.tolist()


@torch.no_grad()
def write_shard(model: torch.nn.Module, sequences: list[list[int]], prompt_len: int, path: Path) -> Path:
    """One hidden-state shard (and its .json) of `sequences`, completion = everything after prompt_len."""
    config = model.config
    ids, masks, aux, final = [], [], [], []
    for sequence in sequences:
        tokens = torch.tensor([sequence])
        mask = torch.zeros(len(sequence), dtype=torch.uint8)
        mask[prompt_len:] = 1
        out = model.model(input_ids=tokens, output_hidden_states=True)
        aux.append(torch.cat([out.hidden_states[i + 1][0] for i in AUX_LAYERS], dim=-1))
        final.append(out.last_hidden_state[0])
        ids.append(tokens[0])
        masks.append(mask)
    return save_shard(
        path, config, AUX_LAYERS, ids, masks, aux, final, [f"{path.stem}-{i}" for i in range(len(sequences))]
    )
