"""The two target tensors the draft needs, read straight from the target's safetensors: the input
embeddings (copied into the draft, frozen) and the lm_head (target logits from the stored final hidden
states; frozen, never exported)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

EMBED_NAMES = ("model.embed_tokens.weight", "language_model.model.embed_tokens.weight", "embed_tokens.weight")
HEAD_NAMES = ("lm_head.weight", "language_model.lm_head.weight")


def _tensor_files(model_dir: Path) -> dict[str, Path]:
    """Tensor name -> file, for a single model.safetensors or a sharded one with an index."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: model_dir / file for name, file in weight_map.items()}
    single = model_dir / "model.safetensors"
    if not single.exists():
        raise FileNotFoundError(f"{model_dir} has neither model.safetensors nor model.safetensors.index.json")
    with safe_open(str(single), "pt") as f:
        return dict.fromkeys(f.keys(), single)


def _read(files: dict[str, Path], names: tuple[str, ...]) -> torch.Tensor | None:
    for name in names:
        if name in files:
            with safe_open(str(files[name]), "pt") as f:
                return f.get_tensor(name)
    return None


def load_target_embed_and_head(model_dir: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed_tokens [V, H], lm_head [V, H]) of the target; a tied head is the embedding."""
    model_dir = Path(model_dir)
    files = _tensor_files(model_dir)
    embed = _read(files, EMBED_NAMES)
    if embed is None:
        raise KeyError(f"no embedding tensor ({' / '.join(EMBED_NAMES)}) in {model_dir}")
    head = _read(files, HEAD_NAMES)
    return embed, embed if head is None else head
