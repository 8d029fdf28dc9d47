"""Running the target and capturing three aux layer outputs plus the final (post-norm) hidden state.

We call the decoder stack (`model.get_decoder()`, e.g. `LlamaModel`), not the causal-LM wrapper: the
lm_head and its [T, vocab] logits (163,840 wide for Kimi-K2.5) are never computed. Forward hooks on the
three aux decoder layers keep only those outputs instead of all N+1 `output_hidden_states`. The final
state is the stack's `last_hidden_state`, i.e. after the final norm: exactly what lm_head sees. Every
layer still has to run, since the final state needs the whole stack.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
PAD_ID = 0  # any valid id: right padding under a causal mask never reaches a real token


def text_config(model_config: Any) -> Any:
    """The language model's config (VL wrappers such as Kimi-K2.5 nest it as text_config)."""
    getter = getattr(model_config, "get_text_config", None)
    return getter() if getter else model_config


def decoder_parts(model: nn.Module) -> tuple[nn.Module, nn.ModuleList]:
    """The decoder stack (returns post-norm `last_hidden_state`) and its list of decoder layers.

    Raises:
        TypeError: when the model has no recognisable decoder stack.
    """
    base = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not hasattr(base, "norm"):
        raise TypeError(f"{type(model).__name__}: no decoder stack with .layers and .norm to hook into")
    return base, layers


def resolve_compute_dtype(name: str) -> torch.dtype:
    """auto: bfloat16 on accelerators and on CPU (AMX bf16 matmuls are ~4x fp32 here; see
    docs/hidden_states.md for the measured speed and error); otherwise the named dtype."""
    if name == "auto":
        return torch.bfloat16
    return DTYPES[name]


def load_target(
    path: str | Path,
    compute_dtype: torch.dtype,
    device: torch.device,
    device_map: bool,
    trust_remote_code: bool = False,
) -> nn.Module:
    """The target in eval mode: on `device`, or spread over all visible devices with device_map=auto."""
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": compute_dtype, "trust_remote_code": trust_remote_code}
    if device_map:
        kwargs["device_map"] = "auto"
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    if not device_map:
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


@contextmanager
def capture_layers(layers: nn.ModuleList, indices: Sequence[int]) -> Iterator[dict[int, torch.Tensor]]:
    """Forward hooks storing the output of decoder layers `indices` (0-indexed) during a forward."""
    captured: dict[int, torch.Tensor] = {}

    def hook(index: int):
        def store(_module: nn.Module, _args: Any, output: Any) -> None:
            captured[index] = output[0] if isinstance(output, tuple) else output

        return store

    handles = [layers[i].register_forward_hook(hook(i)) for i in indices]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def pad_right(sequences: Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
    """[B, max_len] int64 ids, right-padded with PAD_ID."""
    width = max(len(s) for s in sequences)
    batch = torch.full((len(sequences), width), PAD_ID, dtype=torch.long)
    for row, ids in enumerate(sequences):
        batch[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return batch.to(device)


@torch.inference_mode()
def capture_batch(
    model: nn.Module,
    sequences: Sequence[Sequence[int]],
    aux_layers: Sequence[int],
    storage_dtype: torch.dtype,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run one right-padded batch; per sample (aux [L, 3H], final [L, H]) on CPU in `storage_dtype`.

    No attention mask is passed: the causal mask alone keeps every real token from seeing the padding
    that follows it, and SDPA keeps its fast causal path.
    """
    base, layers = decoder_parts(model)
    device = (
        base.embed_tokens.weight.device if hasattr(base, "embed_tokens") else next(model.parameters()).device
    )
    input_ids = pad_right(sequences, device)
    with capture_layers(layers, aux_layers) as captured:
        final = base(input_ids=input_ids, use_cache=False).last_hidden_state
    aux = torch.cat([captured[i].to("cpu", storage_dtype) for i in aux_layers], dim=-1)
    final = final.to("cpu", storage_dtype)
    return [
        (aux[row, : len(ids)].clone(), final[row, : len(ids)].clone()) for row, ids in enumerate(sequences)
    ]
