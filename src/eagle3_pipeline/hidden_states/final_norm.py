"""The target's final RMSNorm, read from its checkpoint, to make vLLM's last state what training expects.

vLLM's `extract_hidden_states` gives, at id `num_hidden_layers`, the last decoder layer's output
(hidden + residual) BEFORE the final norm; the stored `final_hidden_states` is the state AFTER it (what
lm_head sees, the transformers backend's `last_hidden_state`). The norm is one elementwise op, so it is
applied here, exactly as transformers' Llama/DeepseekV3 RMSNorm computes it: in float32, cast back to the
input dtype, then times the weight. Light imports only (json, torch, safetensors): this module runs in
the pipeline's interpreter (finding the weight) and in the vLLM interpreter (applying it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from eagle3_pipeline.target_shape import TargetShape

SUFFIX = "norm.weight"
# Families whose final norm is not plain `weight * x / rms(x)` (Gemma: `(1 + weight) * ...`).
NON_PLAIN_RMSNORM = ("gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n")


class FinalNormError(ValueError):
    """The target's final norm cannot be rebuilt outside the model; the message names the fix."""


@dataclass(frozen=True)
class FinalNorm:
    """Where the final norm's weight is (file, tensor name) and its epsilon."""

    file: str
    key: str
    eps: float

    def as_dict(self) -> dict[str, str | float]:
        return {"file": self.file, "key": self.key, "eps": self.eps}


def checkpoint_keys(target: Path) -> dict[str, str]:
    """Tensor name -> safetensors file name, from the index when sharded, else from the files."""
    index = target / "model.safetensors.index.json"
    if index.exists():
        return dict(json.loads(index.read_text())["weight_map"])
    keys: dict[str, str] = {}
    for path in sorted(target.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            keys.update(dict.fromkeys(handle.keys(), path.name))
    return keys


def find_final_norm(target: str | Path) -> FinalNorm:
    """The final norm beside the decoder layers: `P + "norm.weight"` where `P + "layers.{N-1}."` exists.

    That rule skips per-layer norms and extra heads (DeepSeek's MTP layer keeps its own
    `shared_head.norm`), and finds the norm under any prefix (`model.`, `language_model.model.`).

    Raises:
        FinalNormError: no such weight, several, a biased norm, or a family whose norm is not plain.
    """
    target = Path(target)
    shape = TargetShape.load(target)
    model_type = shape.model_type
    fallback = "set hidden_states.backend: transformers to extract with transformers instead"
    if model_type in NON_PLAIN_RMSNORM:
        raise FinalNormError(
            f"{target}: the final norm of model_type {model_type!r} is not plain RMSNorm; {fallback}"
        )
    eps = shape.rms_norm_eps
    if eps is None:
        raise FinalNormError(f"{target}/config.json has no rms_norm_eps (not an RMSNorm model?); {fallback}")
    last = int(shape.text["num_hidden_layers"]) - 1
    keys = checkpoint_keys(target)
    prefixes = {k[: -len(SUFFIX)] for k in keys if k.endswith(SUFFIX)}
    found = [
        p
        for p in prefixes
        if (p == "" or p.endswith(".")) and any(k.startswith(f"{p}layers.{last}.") for k in keys)
    ]
    if len(found) != 1:
        raise FinalNormError(
            f"{target}: expected one final norm weight beside layers.{last}, found "
            f"{[p + SUFFIX for p in sorted(found)]}; {fallback}"
        )
    prefix = found[0]
    if f"{prefix}norm.bias" in keys:
        raise FinalNormError(f"{target}: the final norm has a bias (LayerNorm, not RMSNorm); {fallback}")
    key = prefix + SUFFIX
    return FinalNorm(str(target / keys[key]), key, float(eps))


def load_weight(norm: FinalNorm) -> torch.Tensor:
    with safe_open(norm.file, framework="pt") as handle:
        return handle.get_tensor(norm.key)


def rms_norm(states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: float32 variance, cast back to the input dtype, times the weight."""
    x = states.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight.to(states.dtype) * x.to(states.dtype)
