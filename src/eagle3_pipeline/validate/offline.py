"""Offline acceptance: the exported draft run greedily over held-out hidden states of the target.

For every anchor row i of a validation sequence x_0..x_{T-1} (the target has read x_0..x_{i+1}):

    step 0   input token x_{i+1}, hidden fc(aux states at i)          -> guess g_0 for x_{i+2}
    step k   input token g_{k-1} (its own guess), its own hidden out  -> guess g_k for x_{i+2+k}

and step k is right when g_k (a draft id mapped to a target id through d2t) equals the TARGET's greedy
choice at i+1+k, argmax lm_head(final_hidden_states[i+1+k]): what greedy speculative decoding verifies
against, not the sampled token the trace happens to hold. The target's states come from the trace's own
prefix, so the figure is exact where the trace is greedy and an approximation where a sampled token
differs from the target's argmax (offline.json reports how often that happens).

Anchors: rows whose first guess is completion text (loss_mask[i+2]) and whose `steps` guesses all lie
inside the sequence with a stored final state, so every step has the same anchors. A target argmax
outside the draft vocabulary counts as a miss, as it would in vLLM.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from eagle3_pipeline.draft.config import DraftConfig
from eagle3_pipeline.draft.model import Eagle3Draft, KVCache, shift_left
from eagle3_pipeline.draft.target import load_target_embed_and_head
from eagle3_pipeline.hidden_states.storage import HiddenStateShard
from eagle3_pipeline.validate.acceptance import merge_counts, offline_acceptance, prefix_counts

log = logging.getLogger(__name__)

HEAD_CHUNK_ROWS = 1024  # target logits [1024, V] at a time: 670 MB fp32 at V = 163,840


def load_draft(
    checkpoint_dir: str | Path, target_dir: str | Path, device: torch.device
) -> tuple[Eagle3Draft, torch.Tensor]:
    """The exported checkpoint as an Eagle3Draft (embeddings from the target) and d2t [Vd].

    Raises:
        ValueError: the checkpoint's tensors do not fit its config or the target.
    """
    checkpoint_dir = Path(checkpoint_dir)
    config_json = json.loads((checkpoint_dir / "config.json").read_text())
    fields = DraftConfig.__dataclass_fields__
    config = DraftConfig(
        **{k: config_json[k] for k in fields if k in config_json}
        | {
            "target_hidden_size": config_json.get("target_hidden_size", config_json["hidden_size"]),
        }
    )
    with safe_open(str(checkpoint_dir / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    d2t = tensors.pop("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
    tensors.pop("t2d", None)
    embed, _ = load_target_embed_and_head(target_dir)
    if tuple(embed.shape) != (config.vocab_size, config.hidden_size):
        raise ValueError(
            f"target embeddings {tuple(embed.shape)} do not fit the draft config of {checkpoint_dir}"
        )
    model = Eagle3Draft(config)
    tensors["embed_tokens.weight"] = embed
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=False)
    if missing or unexpected:
        raise ValueError(f"{checkpoint_dir}: missing tensors {missing}, unexpected {unexpected}")
    return model.to(device).eval(), d2t.to(device)


@torch.no_grad()
def target_argmax(final_hidden_states: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
    """The target's greedy next token after each row: [T, H] -> [T] (chunked over rows)."""
    head = lm_head.float()
    return (
        torch.cat([rows.float() @ head.T for rows in final_hidden_states.split(HEAD_CHUNK_ROWS)]).argmax(-1)
        if len(final_hidden_states)
        else torch.zeros(0, dtype=torch.long)
    )


@torch.no_grad()
def greedy_guesses(
    model: Eagle3Draft, d2t: torch.Tensor, input_ids: torch.Tensor, aux: torch.Tensor, steps: int
) -> torch.Tensor:
    """The draft's own chain of `steps` guesses at every row, as target ids: [T] -> [steps, T]."""
    ids = input_ids[None].long()  # [1, T]
    positions = torch.arange(ids.shape[1], device=ids.device)[None]
    hidden = model.project(aux[None])  # [1, T, H]
    tokens = shift_left(ids, 1)  # step 0 reads x_{i+1}
    cache: KVCache = []
    guesses = []
    for k in range(steps):
        hidden, logits = model.step(tokens, hidden, positions + k, cache)
        draft_ids = logits.argmax(-1)  # [1, T]
        tokens = draft_ids + d2t[draft_ids]  # target ids: fed back as the next step's input
        guesses.append(tokens[0])
    return torch.stack(guesses)


def sample_counts(
    guesses: torch.Tensor,
    greedy: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    has_final: torch.Tensor,
) -> dict[str, Any]:
    """Per-step counts of one sequence (see the module docstring for anchors and rightness)."""
    steps, length = guesses.shape
    anchors = length - 1 - steps  # rows i with i + 1 + (steps - 1) < T, i.e. i < T - steps
    if anchors <= 0:
        return {"anchors": 0, "prefix": [0] * steps, "step_right": [0] * steps, "greedy_agree": 0, "loss": 0}
    rows = torch.arange(anchors, device=guesses.device)
    keep = loss_mask[rows + 2].bool()
    right = torch.zeros(anchors, steps, dtype=torch.bool, device=guesses.device)
    for k in range(steps):
        keep &= has_final[rows + 1 + k]
        right[:, k] = guesses[k, :anchors] == greedy[rows + 1 + k]
    right = right[keep].cpu().numpy()
    prefix, total = prefix_counts(right)
    completion = loss_mask[1:].bool() & has_final[:-1]  # predicted token x_{j+1} is completion
    agree = (greedy[:-1] == input_ids[1:].long()) & completion
    return {
        "anchors": total,
        "prefix": prefix.tolist(),
        "step_right": right.sum(axis=0).tolist(),
        "greedy_agree": int(agree.sum()),
        "loss": int(completion.sum()),
    }


def shard_counts(
    path: str | Path,
    model: Eagle3Draft,
    d2t: torch.Tensor,
    lm_head: torch.Tensor,
    steps: int,
    device: torch.device,
) -> list[dict[str, Any]]:
    """sample_counts for every sample of one hidden-state shard."""
    counts = []
    with HiddenStateShard(path) as shard:
        stored_all = shard.metadata.get("final_rows", "all") != "loss_mask"
        for sample in shard:
            sample = {k: v.to(device) for k, v in sample.items()}
            mask = sample["loss_mask"].bool()
            has_final = torch.ones_like(mask) if stored_all else mask
            greedy = target_argmax(sample["final_hidden_states"], lm_head)
            guesses = greedy_guesses(model, d2t, sample["input_ids"], sample["aux_hidden_states"], steps)
            counts.append(sample_counts(guesses, greedy, sample["input_ids"], mask, has_final))
    return counts


def evaluate(
    checkpoint_dir: str | Path,
    target_dir: str | Path,
    shard_paths: Sequence[str | Path],
    steps: int,
    device: str | None = None,
) -> dict[str, Any]:
    """Offline acceptance of the checkpoint over the shards, as the dict written to offline.json."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model, d2t = load_draft(checkpoint_dir, target_dir, dev)
    _, lm_head = load_target_embed_and_head(target_dir)
    lm_head = lm_head.to(dev)
    parts = [c for path in shard_paths for c in shard_counts(path, model, d2t, lm_head, steps, dev)]
    merged = merge_counts([p for p in parts if p["anchors"]])
    result = offline_acceptance(merged["prefix"], merged["step_right"], int(merged["anchors"]))
    loss_tokens = sum(p["loss"] for p in parts)
    return {
        "reference": "target_argmax",
        "steps": steps,
        "samples": len(parts),
        **result.to_dict(),
        "prefix_counts": merged["prefix"],
        "trace_greedy_agreement": sum(p["greedy_agree"] for p in parts) / loss_tokens
        if loss_tokens
        else None,
        "checkpoint": str(checkpoint_dir),
        "shards": [str(p) for p in shard_paths],
    }


def validate_offline(
    checkpoint_dir: str | Path,
    target_dir: str | Path,
    shard_paths: Sequence[str | Path],
    steps: int,
    output_path: str | Path,
) -> dict[str, Any]:
    """Rule validate_offline: write offline.json (see `evaluate`)."""
    from eagle3_pipeline.validate.serving import write_json

    result = evaluate(checkpoint_dir, target_dir, shard_paths, steps)
    lengths = ", ".join(f"{x:.3f}" for x in result["acceptance_length"])
    log.info(
        "offline acceptance over %d anchors: conditional %s; length for k = 1..%d: %s",
        result["anchors"],
        np.round([c or 0 for c in result["conditional"]], 3).tolist(),
        steps,
        lengths,
    )
    write_json(result, output_path)
    return result
