"""The draft's shape, derived from the target model's config.json.

The draft is one Llama decoder layer as wide as the target (EAGLE-3, SpecForge): the hidden size, heads,
MLP width and norm epsilon are the target's, so that its frozen embeddings and the fc over three
auxiliary states fit without extra projections.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

NUM_AUX_LAYERS = 3  # EAGLE-3 fuses a low, a middle and a high target layer


@dataclass(frozen=True)
class DraftConfig:
    """Everything that fixes the draft's tensor shapes and its arithmetic."""

    hidden_size: int  # H: the draft's width, equal to the target's
    target_hidden_size: int  # width of each auxiliary state (fc input is NUM_AUX_LAYERS x this)
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int  # the target vocabulary (embeddings, t2d)
    draft_vocab_size: int  # the draft's lm_head rows

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_target_config(path: str | Path) -> dict[str, Any]:
    """The target's config.json (a model directory or the file itself); a VL wrapper's text_config
    (Kimi-K2.5) is unwrapped, since the draft only sees the language model."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(
            f"target config {file} does not exist; set target.model to the weights folder"
        )
    config = json.loads(file.read_text())
    if "hidden_size" not in config and isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    missing = [k for k in ("hidden_size", "num_attention_heads", "vocab_size") if k not in config]
    if missing:
        raise ValueError(f"target config {file} lacks {missing}; is target.model a causal LM?")
    return config


def rope_theta_of(config: dict[str, Any]) -> float:
    """rope_theta, from transformers 4 (top level) or 5 (rope_parameters) configs."""
    if "rope_theta" in config:
        return float(config["rope_theta"])
    return float((config.get("rope_parameters") or {}).get("rope_theta", 10000.0))


def draft_config_from_target(target: dict[str, Any], draft_vocab_size: int) -> DraftConfig:
    """The draft's shape for `target` (a parsed config.json); draft_vocab_size is capped at the target's.

    The draft always uses plain RoPE with the target's theta (trained and served alike); a target's own
    rope scaling is not carried over.
    """
    hidden = int(target["hidden_size"])
    heads = int(target["num_attention_heads"])
    head_dim = int(target.get("head_dim") or hidden // heads)
    return DraftConfig(
        hidden_size=hidden,
        target_hidden_size=hidden,
        intermediate_size=int(target.get("intermediate_size") or 4 * hidden),
        num_attention_heads=heads,
        num_key_value_heads=int(target.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rms_norm_eps=float(target.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta_of(target),
        max_position_embeddings=int(target.get("max_position_embeddings", 8192)),
        vocab_size=int(target["vocab_size"]),
        draft_vocab_size=min(int(draft_vocab_size), int(target["vocab_size"])),
    )
