"""The EAGLE-3 draft model, readable top to bottom (nanoGPT order: norm, rotary, attention, MLP, layer,
model). Shapes: B batch rows, T tokens per row, H hidden, nh heads, hd head dim, V target vocab,
Vd draft vocab.

One draft step, as vLLM and SGLang run it (vllm/model_executor/models/llama_eagle3.py):

    h0 = fc(cat(aux_low, aux_mid, aux_high))                  # step 0 only: [B, T, 3H] -> [B, T, H]
    x  = cat(input_layernorm(embed(token)), hidden_norm(h))   # [B, T, 2H], embeddings first
    h' = h + attn(x)                                          # residual from h before hidden_norm
    h' = h' + mlp(post_attention_layernorm(h'))               # fed back as h at the next step
    logits = lm_head(norm(h'))                                # [B, T, Vd]

EAGLE-3.1's options (config draft.*, speculators' Eagle3SpeculatorConfig and vLLM's llama_eagle3.py read
them under the same names): `norm_before_fc` puts one RMSNorm (input_norm) over cat(aux_low, aux_mid,
aux_high) before fc; `fc_norm` one RMSNorm per auxiliary state (fc_norm.0-2) instead; `norm_output`
feeds norm(h') back as the next step's h instead of h'.

With draft.architecture deepseek_mla the layer's attention is the target's multi-head latent attention
(mla.py: MLAAttention, its own decoupled YaRN rope), everything else unchanged, as vLLM's
deepseek_eagle3.py runs it; each attention module gives its own rope tables (`rotary`).

Training-time test keeps every step's keys and values (a list, `cache`): a query of step k sees step 0's
keys causally and, at its own position only, the key of each step 1..k (attention.py: `ttt_attention`,
in memory linear in T; the quadratic reference is benchmarks/ttt_reference.py's).

Training reads `hidden_states` (the normed outputs of every step, not their logits: the loss applies
lm_head chunk by chunk, ttt.py) and may checkpoint each step (`checkpointing`): the step's activations
are dropped after its forward and recomputed in the backward pass, so only its inputs, its keys and
values and its output are kept across the steps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from eagle3_pipeline.draft.attention import KVCache, ttt_attention
from eagle3_pipeline.draft.mla import MLAAttention
from eagle3_pipeline.draft.norm import RMSNorm
from eagle3_pipeline.draft_config import NUM_AUX_LAYERS, DraftConfig

# (q, cache, scale=None) -> output: attention.ttt_attention, or a reference computing the same numbers
AttentionForm = Callable[..., torch.Tensor]


def shift_left(x: torch.Tensor, n: int) -> torch.Tensor:
    """x [B, T, ...] moved n places left along T, zero (False) filled: out[:, i] = x[:, i + n]."""
    if n == 0:
        return x
    pad = torch.zeros_like(x[:, : min(n, x.shape[1])])
    return torch.cat([x[:, n:], pad], dim=1)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for rotary embeddings at `positions` [B, T] -> each [B, 1, T, hd] (neox layout)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    freqs = positions.float()[..., None] * inv_freq  # [B, T, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # [B, 1, T, hd]
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class DraftAttention(nn.Module):
    """Llama attention whose q/k/v read 2H (embedding and hidden state side by side)."""

    def __init__(self, config: DraftConfig, attention: AttentionForm = ttt_attention) -> None:
        super().__init__()
        self.attention = attention
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        width = 2 * config.hidden_size
        self.q_proj = nn.Linear(width, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)
        self.rope_theta = config.rope_theta

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, 1, T, hd] at positions [B, T] (plain rope, neox layout)."""
        return rope_cos_sin(positions, self.head_dim, self.rope_theta)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Appends this step's keys and values to `cache`."""
        out, kv = self.attend(x, cos, sin, cache)
        cache.append(kv)
        return out

    def attend(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """(output, this step's (keys, values)) over the earlier steps' `cache`, left unchanged."""
        batch, seq_len, _ = x.shape
        q = self.q_proj(x).view(batch, seq_len, self.heads, self.head_dim).transpose(1, 2)  # [B, nh, T, hd]
        k = self.k_proj(x).view(batch, seq_len, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq_len, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        groups = self.heads // self.kv_heads  # grouped-query attention: share each kv head
        kv = (k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1))
        out = self.attention(q, [*cache, kv]).transpose(1, 2).reshape(batch, seq_len, -1)  # [B, T, nh * hd]
        return self.o_proj(out), kv


class DraftMLP(nn.Module):
    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftDecoderLayer(nn.Module):
    """The single decoder layer ("midlayer" in the checkpoint): Llama attention, or MLA (mla.py) for
    draft.architecture deepseek_mla; the rest is the same in both (vLLM's deepseek_eagle3.py)."""

    def __init__(self, config: DraftConfig, attention: AttentionForm = ttt_attention) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)  # on the embeddings
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)  # on the fed hidden state
        mla = config.architecture == "deepseek_mla"
        self.self_attn = MLAAttention(config, attention) if mla else DraftAttention(config, attention)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DraftMLP(config)

    def forward(
        self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        """Appends this step's keys and values to `cache`."""
        hidden, kv = self.run(embeds, hidden, cos, sin, cache)
        cache.append(kv)
        return hidden

    def run(
        self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """(output, this step's keys and values), `cache` left unchanged."""
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)  # [B, T, 2H]
        out, kv = self.self_attn.attend(x, cos, sin, cache)
        hidden = hidden + out
        return hidden + self.mlp(self.post_attention_layernorm(hidden)), kv  # pre-norm output, fed back


class Eagle3Draft(nn.Module):
    """fc over the three auxiliary target states, one decoder layer, norm, draft-vocabulary lm_head.

    embed_tokens is the target's, frozen, and never exported (vLLM and SGLang share the target's).
    `attention` is the TTT attention form (AttentionForm; a reference gives the same numbers). `checkpointing`
    recomputes each TTT step's activations in the backward pass instead of keeping them (same numbers).
    """

    def __init__(
        self, config: DraftConfig, attention: AttentionForm = ttt_attention, checkpointing: bool = False
    ) -> None:
        super().__init__()
        self.config = config
        self.checkpointing = checkpointing
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        fc_width = NUM_AUX_LAYERS * config.target_hidden_size
        # EAGLE-3.1 (module docstring): one norm over the fc input, or one per auxiliary state
        self.input_norm = RMSNorm(fc_width, config.rms_norm_eps) if config.norm_before_fc else None
        per_state = (RMSNorm(config.target_hidden_size, config.rms_norm_eps) for _ in range(NUM_AUX_LAYERS))
        self.fc_norm = nn.ModuleList(per_state) if config.fc_norm else None
        self.fc = nn.Linear(fc_width, config.hidden_size, bias=False)
        self.midlayer = DraftDecoderLayer(config, attention)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)

    def project(self, aux_hidden_states: torch.Tensor) -> torch.Tensor:
        """[B, T, 3H_target] -> [B, T, H]: the step-0 hidden state."""
        if self.input_norm is not None:
            aux_hidden_states = self.input_norm(aux_hidden_states)
        if self.fc_norm is not None:
            chunks = aux_hidden_states.chunk(NUM_AUX_LAYERS, dim=-1)
            aux_hidden_states = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks, strict=True)], -1)
        if torch.is_autocast_enabled(aux_hidden_states.device.type):  # fc casts it: no fp32 copy between
            return self.fc(aux_hidden_states)
        return self.fc(aux_hidden_states.to(self.fc.weight.dtype))

    def step(
        self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache: KVCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step: tokens [B, T], hidden [B, T, H], positions [B, T] -> (the next step's hidden
        [B, T, H]: h', or norm(h') with norm_output; logits [B, T, Vd]). Appends this step's keys and
        values to `cache`."""
        cos, sin = self.midlayer.self_attn.rotary(positions)
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)
        hidden = self.midlayer(embeds, hidden, cos, sin, cache)
        normed = self.norm(hidden)
        return (normed if self.config.norm_output else hidden), self.lm_head(normed)

    def forward(
        self, aux_hidden_states: torch.Tensor, input_ids: torch.Tensor, steps: int, logits: bool = True
    ) -> list[torch.Tensor]:
        """Training-time test: `steps` draft steps over whole sequences; -> logits [B, T, Vd] per step,
        or with logits=False `hidden_states` (training applies lm_head inside the chunked loss)."""
        normed = self.hidden_states(aux_hidden_states, input_ids, steps)
        return [self.lm_head(h) for h in normed] if logits else normed

    def _checkpointed_step(
        self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, *cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step as a pure function of tensors (what torch.utils.checkpoint recomputes): cache is the
        earlier steps' keys then their values; -> (hidden', norm(hidden'), keys, values)."""
        cos, sin = self.midlayer.self_attn.rotary(positions)
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)
        half = len(cache) // 2
        pairs = list(zip(cache[:half], cache[half:], strict=True))
        hidden, (k, v) = self.midlayer.run(embeds, hidden, cos, sin, pairs)
        normed = self.norm(hidden)
        return (normed if self.config.norm_output else hidden), normed, k, v  # norm_output: normed fed back

    def hidden_states(
        self, aux_hidden_states: torch.Tensor, input_ids: torch.Tensor, steps: int
    ) -> list[torch.Tensor]:
        """Training-time test: `steps` draft steps over whole sequences; -> norm(hidden') [B, T, H] per
        step, whose lm_head gives the step's logits.

        Row i of step k is the draft's guess for token i + 2 + k, made from the target's features up to
        token i and k guesses of its own before: its input token is input_ids[i + 1 + k] (teacher-forced,
        shifted one more place left each step), its hidden state the previous step's output at row i, and
        its position i + k, as in vLLM where each draft step advances the position by one.
        """
        hidden = self.project(aux_hidden_states)  # [B, T, H]
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        normed = []
        recompute = self.checkpointing and torch.is_grad_enabled()
        for k in range(steps):
            args = (shift_left(input_ids, 1 + k), hidden, positions + k, *keys, *values)
            if recompute:  # non-reentrant: keeps the autocast state and nests with the attention's Function
                out = checkpoint(self._checkpointed_step, *args, use_reentrant=False)
            else:
                out = self._checkpointed_step(*args)
            hidden, step_normed, key, value = out
            keys.append(key)
            values.append(value)
            normed.append(step_normed)
        return normed

    def exported_state_dict(self) -> dict[str, torch.Tensor]:
        """The trained tensors under their checkpoint names (no embeddings)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("embed_tokens.")}

    def load_trained(self, tensors: dict[str, torch.Tensor]) -> None:
        """Load `exported_state_dict`'s tensors (the frozen embeddings stay as they are).

        Raises:
            ValueError: a trained tensor is missing, or one is not the draft's.
        """
        missing, unexpected = self.load_state_dict(tensors, strict=False)
        missing = [k for k in missing if not k.startswith("embed_tokens.")]
        if missing or unexpected:
            raise ValueError(f"draft tensors missing: {missing}, unexpected: {unexpected}")
