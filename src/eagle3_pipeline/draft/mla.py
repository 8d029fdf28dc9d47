"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) for the draft's decoder layer, as vLLM 0.32 serves
it in an EAGLE-3 draft (models/deepseek_eagle3.py: DeepseekV2MLAAttention with a 2H input). Shapes: B
batch rows, T tokens, nh heads, r_q / r_kv the q / kv LoRA ranks, d_n / d_r / d_v the nope, rope and value
head sizes (Kimi-K2.5: 1536 / 512, 128 / 64 / 128, so queries and keys are 192 wide and values 128).

    q       = q_b_proj(q_a_layernorm(q_a_proj(x)))          # [B, T, nh * (d_n + d_r)]; q_proj(x) without r_q
    c, k_r  = split(kv_a_proj_with_mqa(x), [r_kv, d_r])      # the latent and one shared rope key per token
    k_n, v  = split(kv_b_proj(kv_a_layernorm(c)), [d_n, d_v]) per head
    k       = cat(k_n, rope(k_r) on every head);  q = cat(q_n, rope(q_r))
    out     = o_proj(attention(q, k, v))   # scale (d_n + d_r)^-1/2, times mscale^2 under YaRN

Decoupled rope: only the d_r-wide parts rotate, interleaved (GPT-J pairs (x0, x1), (x2, x3), ...: vLLM's
is_neox_style=False; transformers' rope_interleave), with the target's YaRN scaling as vLLM's
DeepseekScalingRotaryEmbedding computes it (frequencies blended between interpolation and extrapolation
over the correction range, cos and sin times mscale(factor, mscale) / mscale(factor, mscale_all_dim)).

Training runs on whole keys and values per TTT step, in the same linear-memory attention as the Llama
draft (attention.py, with the value width and the scale passed along); the latent compression is what
the served KV cache keeps (kv_lora_rank + qk_rope_head_dim per token), not a change of the numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from eagle3_pipeline.draft.attention import KVCache
from eagle3_pipeline.draft.norm import RMSNorm
from eagle3_pipeline.draft_config import DraftConfig


def yarn_mscale(factor: float, mscale: float) -> float:
    """DeepSeek's YaRN magnitude correction (vLLM yarn_get_mscale)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _correction_dim(rotations: float, dim: int, base: float, max_position: int) -> float:
    return dim * math.log(max_position / (rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_inv_freq(dim: int, base: float, yarn: dict[str, Any]) -> torch.Tensor:
    """Inverse frequencies [dim / 2] of DeepSeek's YaRN rope (vLLM DeepseekScalingRotaryEmbedding)."""
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (yarn["factor"] * pos_freqs)
    original = yarn["original_max_position_embeddings"]
    low = max(math.floor(_correction_dim(yarn["beta_fast"], dim, base, original)), 0)
    high = min(math.ceil(_correction_dim(yarn["beta_slow"], dim, base, original)), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float) - low) / (high - low if high != low else 0.001)).clamp(
        0, 1
    )
    keep = 1 - ramp  # 1: extrapolate (high frequencies), 0: interpolate (low ones)
    return interpolation * (1 - keep) + extrapolation * keep


def mla_rope_cos_sin(
    positions: torch.Tensor, dim: int, base: float, yarn: dict[str, Any] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin at `positions` [B, T] -> each [B, 1, T, dim], interleaved layout (each frequency twice
    in a row), YaRN-scaled when `yarn` is given."""
    if yarn is None:
        inv_freq, mscale = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim), 1.0
    else:
        inv_freq = yarn_inv_freq(dim, base, yarn)
        mscale = yarn_mscale(yarn["factor"], yarn["mscale"]) / yarn_mscale(
            yarn["factor"], yarn["mscale_all_dim"]
        )
    freqs = positions.float()[..., None] * inv_freq.to(positions.device)  # [B, T, dim / 2]
    emb = freqs.repeat_interleave(2, dim=-1)[:, None]  # [B, 1, T, dim]
    return emb.cos() * mscale, emb.sin() * mscale


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-J rotation of pairs (x0, x1), (x2, x3), ... (vLLM rotate_gptj)."""
    rotated = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def mla_scale(config: DraftConfig) -> float:
    """Attention score scale: (d_n + d_r)^-1/2, times mscale(factor, mscale_all_dim)^2 under YaRN (vLLM
    DeepseekV2MLAAttention)."""
    scale = config.qk_head_dim**-0.5
    if config.rope_scaling is not None:
        m = yarn_mscale(config.rope_scaling["factor"], config.rope_scaling["mscale_all_dim"])
        scale *= m * m
    return scale


class MLAAttention(nn.Module):
    """MLA whose input projections read 2H (embedding and hidden state side by side); module docstring.
    Tensor names are vLLM's and the DeepSeek checkpoints' (q_a_proj, kv_a_proj_with_mqa, ...)."""

    def __init__(self, config: DraftConfig, attention: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.config, self.attention, self.scale = config, attention, mla_scale(config)
        self.heads = config.num_attention_heads
        width, eps = 2 * config.hidden_size, config.rms_norm_eps
        q_width = self.heads * config.qk_head_dim
        if config.q_lora_rank:
            self.q_a_proj = nn.Linear(width, config.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank, eps)
            self.q_b_proj = nn.Linear(config.q_lora_rank, q_width, bias=False)
        else:
            self.q_proj = nn.Linear(width, q_width, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(width, config.kv_lora_rank + config.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(config.kv_lora_rank, eps)
        kv_width = self.heads * (config.qk_nope_head_dim + config.v_head_dim)
        self.kv_b_proj = nn.Linear(config.kv_lora_rank, kv_width, bias=False)
        self.o_proj = nn.Linear(self.heads * config.v_head_dim, config.hidden_size, bias=False)

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        return mla_rope_cos_sin(positions, c.qk_rope_head_dim, c.rope_theta, c.rope_scaling)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, 2H] -> [B, nh, T, d_n + d_r], before rope."""
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.config.q_lora_rank else self.q_proj(x)
        return q.view(*x.shape[:2], self.heads, self.config.qk_head_dim).transpose(1, 2)

    def attend(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """(output [B, T, H], this step's (keys [B, nh, T, d_n + d_r], values [B, nh, T, d_v])) over the
        earlier steps' `cache`, left unchanged."""
        c, (batch, seq_len, _) = self.config, x.shape
        q_nope, q_rope = self.queries(x).split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(batch, seq_len, self.heads, -1).transpose(1, 2)
        k_nope, v = kv.split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)  # [B, nh, T, d_n], [B, nh, T, d_v]
        k_rope = apply_rope_interleaved(k_rope[:, None], cos, sin)  # [B, 1, T, d_r]: one key for all heads
        q = torch.cat([q_nope, apply_rope_interleaved(q_rope, cos, sin)], dim=-1)
        k = torch.cat([k_nope, k_rope.expand(-1, self.heads, -1, -1)], dim=-1)
        out = self.attention(q, [*cache, (k, v)], scale=self.scale)  # [B, nh, T, d_v]
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq_len, -1)), (k, v.contiguous())

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Appends this step's keys and values to `cache`."""
        out, kv = self.attend(x, cos, sin, cache)
        cache.append(kv)
        return out
