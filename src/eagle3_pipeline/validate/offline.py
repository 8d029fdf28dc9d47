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

With a `Slicing`, offline.json also holds the same counts by context-length bucket and by thinking vs
answer, against the target's argmax and against the trace's own tokens, and the served run replayed
along each trace, per sample, for the serve check's matched comparison (validate/slices.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from eagle3_pipeline.draft.export import aux_layers_from_metadata
from eagle3_pipeline.draft.init_from import write_eagle_checkpoint
from eagle3_pipeline.draft.job import draft_shape
from eagle3_pipeline.draft.model import Eagle3Draft, KVCache, shift_left
from eagle3_pipeline.draft.target import load_target_embed_and_head
from eagle3_pipeline.draft_config import (
    draft_config_from_target,
    read_checkpoint_config,
    read_target_config,
)
from eagle3_pipeline.hidden_states.storage import HiddenStateShard
from eagle3_pipeline.settings import DraftSettings
from eagle3_pipeline.validate.acceptance import merge_counts, offline_acceptance, prefix_counts
from eagle3_pipeline.validate.intervals import acceptance_interval
from eagle3_pipeline.validate.slices import (
    answer_start,
    merge_slices,
    replay,
    slice_counts,
    special_token_ids,
)

log = logging.getLogger(__name__)

HEAD_CHUNK_ROWS = 1024  # target logits [1024, V] at a time: 670 MB fp32 at V = 163,840


@dataclass(frozen=True)
class Slicing:
    """What offline.json reports beside the overall figure (validate/slices.py).

    Attributes:
        context_buckets: context-length bucket boundaries in tokens (validate.context_buckets).
        think: the target tokenizer's `<think>` / `</think>` ids (`special_token_ids`); empty: no split.
        served_k: draft tokens per step of the replayed served run (validate.num_speculative_tokens).
        served_max_tokens: the served requests' max_tokens (None: the whole trace).
    """

    context_buckets: tuple[int, ...] = (512, 2048, 8192)
    think: tuple[tuple[str, int], ...] = ()
    served_k: int = 3
    served_max_tokens: int | None = None


def load_draft(
    checkpoint_dir: str | Path, target_dir: str | Path, device: torch.device
) -> tuple[Eagle3Draft, torch.Tensor]:
    """The exported checkpoint as an Eagle3Draft (embeddings from the target) and d2t [Vd].

    Raises:
        ValueError: the checkpoint's tensors do not fit its config or the target.
    """
    checkpoint_dir = Path(checkpoint_dir)
    config = read_checkpoint_config(checkpoint_dir).draft_config()
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
    slicing: Slicing | None = None,
) -> dict[str, Any]:
    """Per-step counts of one sequence (see the module docstring for anchors and rightness); with
    `slicing`, "slices" too: per reference (greedy, sampled), counts per context bucket and part."""
    steps, length = guesses.shape
    anchors = length - 1 - steps  # rows i with i + 1 + (steps - 1) < T, i.e. i < T - steps
    if anchors <= 0:
        empty = {"anchors": 0, "prefix": [0] * steps, "step_right": [0] * steps, "greedy_agree": 0, "loss": 0}
        return empty | ({"slices": {}} if slicing else {})
    rows = torch.arange(anchors, device=guesses.device)
    keep = loss_mask[rows + 2].bool()
    right = torch.zeros(anchors, steps, dtype=torch.bool, device=guesses.device)
    sampled = torch.zeros_like(right)
    for k in range(steps):
        keep &= has_final[rows + 1 + k]
        right[:, k] = guesses[k, :anchors] == greedy[rows + 1 + k]
        sampled[:, k] = guesses[k, :anchors] == input_ids[rows + 2 + k].long()
    right, sampled, kept = right[keep].cpu().numpy(), sampled[keep].cpu().numpy(), rows[keep].cpu().numpy()
    prefix, total = prefix_counts(right)
    completion = loss_mask[1:].bool() & has_final[:-1]  # predicted token x_{j+1} is completion
    agree = (greedy[:-1] == input_ids[1:].long()) & completion
    counts = {
        "anchors": total,
        "prefix": prefix.tolist(),
        "step_right": right.sum(axis=0).tolist(),
        "greedy_agree": int(agree.sum()),
        "loss": int(completion.sum()),
    }
    if slicing is not None:
        answer_from = answer_start(input_ids, loss_mask, dict(slicing.think))
        counts["slices"] = {
            reference: slice_counts(hits, kept, slicing.context_buckets, answer_from)
            for reference, hits in (("greedy", right), ("sampled", sampled))
        }
    return counts


def shard_counts(
    path: str | Path,
    model: Eagle3Draft,
    d2t: torch.Tensor,
    lm_head: torch.Tensor,
    steps: int,
    device: torch.device,
    slicing: Slicing | None = None,
) -> list[dict[str, Any]]:
    """sample_counts for every sample of one hidden-state shard; with `slicing`, each sample's "id" and
    its "replay" (the served run replayed along it, validate/slices.py) too."""
    counts = []
    with HiddenStateShard(path) as shard:
        stored_all = shard.metadata.get("final_rows", "all") != "loss_mask"
        ids = shard.metadata.get("ids") or [f"{Path(path).name}:{i}" for i in range(len(shard))]
        unroll = max(steps, slicing.served_k) if slicing else steps
        for sample_id, sample in zip(ids, shard, strict=True):
            sample = {k: v.to(device) for k, v in sample.items()}
            mask = sample["loss_mask"].bool()
            has_final = torch.ones_like(mask) if stored_all else mask
            greedy = target_argmax(sample["final_hidden_states"], lm_head)
            guesses = greedy_guesses(model, d2t, sample["input_ids"], sample["aux_hidden_states"], unroll)
            counts.append(
                sample_counts(guesses[:steps], greedy, sample["input_ids"], mask, has_final, slicing)
            )
            if slicing is not None:
                counts[-1] |= {"id": sample_id}
                # greedy serving accepts the target's argmax, sampled serving the trace's token (slices.py)
                argmax_tokens = torch.cat([sample["input_ids"][:1].long(), greedy[:-1]])
                counts[-1]["replay"] = {
                    reference: replay(guesses, tokens, mask, slicing.served_k, slicing.served_max_tokens)
                    for reference, tokens in (("greedy", argmax_tokens), ("sampled", sample["input_ids"]))
                }
    return counts


def slice_figures(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """offline.json's "slices": per reference, per slice, anchors, prefix counts and the acceptance."""
    figures: dict[str, Any] = {}
    for reference in ("greedy", "sampled"):
        per_sample = [p["slices"][reference] for p in parts if p.get("slices")]
        merged = merge_slices(per_sample)
        figures[reference] = {
            name: {"prefix_counts": c["prefix"]}
            | offline_acceptance(c["prefix"], c["prefix"], c["anchors"]).to_dict()
            | {"ci95": _slice_interval(per_sample, name)}
            for name, c in merged.items()
        }
    return figures


def _slice_interval(per_sample: Sequence[dict[str, Any]], name: str) -> list[list[float] | None]:
    """A slice's question-level 95% interval per k: the questions that have anchors in it, resampled."""
    rows = [(s[name]["anchors"], s[name]["prefix"]) for s in per_sample if s.get(name, {}).get("anchors")]
    return acceptance_interval(rows)["ci95"]


def evaluate(
    checkpoint_dir: str | Path,
    target_dir: str | Path,
    shard_paths: Sequence[str | Path],
    steps: int,
    device: str | None = None,
    slicing: Slicing | None = None,
) -> dict[str, Any]:
    """Offline acceptance of the checkpoint over the shards, as the dict written to offline.json (with
    `slicing`: "slices" and "served_replay" too; the default slices over the target's think tokens)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    slicing = slicing or default_slicing(target_dir, steps)
    model, d2t = load_draft(checkpoint_dir, target_dir, dev)
    _, lm_head = load_target_embed_and_head(target_dir)
    lm_head = lm_head.to(dev)
    parts = [c for path in shard_paths for c in shard_counts(path, model, d2t, lm_head, steps, dev, slicing)]
    merged = merge_counts([p for p in parts if p["anchors"]])
    result = offline_acceptance(merged["prefix"], merged["step_right"], int(merged["anchors"]))
    loss_tokens = sum(p["loss"] for p in parts)
    every_anchor = acceptance_interval([(p["anchors"], p["prefix"]) for p in parts if p["anchors"]])
    return {
        "reference": "target_argmax",
        "steps": steps,
        "samples": len(parts),
        **result.to_dict(),
        "ci95": every_anchor["ci95"],  # per k, question-level (validate/intervals.py)
        "interval": {key: every_anchor[key] for key in ("questions", "draws", "seed", "unit")},
        "replayed": replayed_figures(parts),
        # per question: [anchors, first 1..steps guesses right], the counts the intervals resample
        "per_sample": {p["id"]: [p["anchors"], *p["prefix"]] for p in parts if "id" in p},
        "prefix_counts": merged["prefix"],
        "trace_greedy_agreement": sum(p["greedy_agree"] for p in parts) / loss_tokens
        if loss_tokens
        else None,
        "slices": slice_figures(parts),
        "slicing": {
            "context_buckets": list(slicing.context_buckets),
            "thinking_split": bool(slicing.think),
            "context_length": "tokens the target has read before the first draft token (prompt included)",
        },
        "served_replay": {
            "num_speculative_tokens": slicing.served_k,
            "max_tokens": slicing.served_max_tokens,
            "samples": {p["id"]: p["replay"] for p in parts},
        },
        "checkpoint": str(checkpoint_dir),
        "shards": [str(p) for p in shard_paths],
    }


def replayed_figures(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The served run replayed along every validation trace (drafts only where vLLM drafts: after each
    verification step), per reference, as an acceptance length per k with its question-level interval:
    the offline figure a served one is compared with (offline.json's "acceptance_length" counts every
    completion position instead, and reads higher)."""
    replays = [p["replay"] for p in parts if p.get("replay")]
    return {
        reference: acceptance_interval(
            [(r[reference]["drafts"], r[reference]["accepted_per_position"]) for r in replays]
        )
        for reference in ("greedy", "sampled")
        if replays
    }


def default_slicing(
    target_dir: str | Path,
    served_k: int,
    context_buckets: Sequence[int] = Slicing.context_buckets,
    served_max_tokens: int | None = None,
) -> Slicing:
    """A Slicing with the target tokenizer's `<think>` / `</think>` ids (none found: no thinking split)."""
    from eagle3_pipeline.validate.slices import THINK_END, THINK_START, check_boundaries

    special = special_token_ids(target_dir)
    think = tuple((t, special[t]) for t in (THINK_START, THINK_END) if t in special)
    return Slicing(
        tuple(check_boundaries(context_buckets)),
        think if len(think) == 2 else (),
        served_k,
        served_max_tokens,
    )


def validate_offline(
    checkpoint_dir: str | Path,
    target_dir: str | Path,
    shard_paths: Sequence[str | Path],
    steps: int,
    output_path: str | Path,
    context_buckets: Sequence[int] = Slicing.context_buckets,
    num_speculative_tokens: int | None = None,
    served_max_tokens: int | None = None,
) -> dict[str, Any]:
    """Rule validate_offline: write offline.json (see `evaluate`; the slices by `context_buckets`, the
    serve check's run replayed with `num_speculative_tokens` (default: steps) and `served_max_tokens`)."""
    from eagle3_pipeline.validate.serve_check import write_json

    slicing = default_slicing(target_dir, num_speculative_tokens or steps, context_buckets, served_max_tokens)
    result = evaluate(checkpoint_dir, target_dir, shard_paths, steps, slicing=slicing)
    lengths = ", ".join(f"{x:.3f}" for x in result["acceptance_length"])
    log.info(
        "offline acceptance over %d anchors: conditional %s; length for k = 1..%d: %s",
        result["anchors"],
        np.round([c or 0 for c in result["conditional"]], 3).tolist(),
        steps,
        lengths,
    )
    for reference, slices in result["slices"].items():
        log.info(
            "by slice, %s reference: %s",
            reference,
            "; ".join(
                f"{name} {s['acceptance_length'][-1]:.3f} ({s['anchors']})" for name, s in slices.items()
            ),
        )
    write_json(result, output_path)
    return result


def validate_starting_draft(
    init_from: str | Path,
    target_dir: str | Path,
    draft: DraftSettings,
    shard_paths: Sequence[str | Path],
    work: str | Path,
    output_path: str | Path,
    **offline: Any,
) -> dict[str, Any]:
    """Rule validate_offline_init: the starting draft (its own vocabulary), checked against this run's
    draft, written as an EAGLE folder under `work` and run through the offline check the trained draft
    gets (validate_offline, `offline`: its keyword arguments), on the same validation states."""
    config = draft_config_from_target(
        read_target_config(target_dir), draft.draft_vocab_size, **draft_shape(draft)
    )
    aux = aux_layers_from_metadata(Path(shard_paths[0]).with_suffix(".json"))
    folder = write_eagle_checkpoint(init_from, config, aux, Path(work) / "checkpoint")
    return validate_offline(folder, target_dir, shard_paths, output_path=output_path, **offline)
