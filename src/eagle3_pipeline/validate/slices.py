"""Offline acceptance by slice, and the served run replayed along each validation trace.

Slices. Each anchor (offline.py: row i, the draft guessing x_{i+2} .. after the target read x_0..x_{i+1})
falls in one context-length bucket, by its context length i + 2 (prompt included; boundaries from
validate.context_buckets), and in one part of the reply: thinking (up to and including the `</think>`
that closes the reply's thinking block) or answer (after it). Every slice is counted against two
references: the target's greedy choice (what greedy verification accepts) and the token the trace
holds (sampled at generation.temperature / top_p: what sampled verification accepts in expectation,
below).

Served run replayed ("matched"). vLLM's EAGLE proposer drafts the argmax of the draft
(`draft_sample_method: greedy`, no draft probabilities) and its rejection sampler then accepts a draft
token x with probability p_target(x) under the request's temperature and top_p, and on a rejection
samples from p_target without x (vllm/v1/sample/rejection_sampler.py, `rejection_random_sample_kernel`,
NO_DRAFT_PROBS; vllm/v1/spec_decode/llm_base_proposer.py). Along a trace sampled from the same target at
the same sampling, "the draft's guess equals the trace's next token" happens with the same probability
p_target(x), and after a miss the trace goes on with a token drawn from p_target without x. So walking
each trace as vLLM would (the first draft right after the first reply token, the next one after the
accepted tokens and the one the target adds) gives per-position counts with the same expectation as
vLLM's /metrics over fresh replies to the same questions at that sampling and length. For greedy
serving the walk compares the guesses with the target's argmax instead (what the greedy rejection rule
accepts) along the trace's own context: exact where the trace took the argmax, which offline.json's
`trace_greedy_agreement` counts. The walk's anchors are where vLLM drafts (after each verification
step), not every position: on the demo that alone explained the 0.08 per position by which served
greedy acceptance sat below the figure over every anchor.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eagle3_pipeline.validate.acceptance import prefix_counts

THINK_START, THINK_END = "<think>", "</think>"


def bucket_names(boundaries: Sequence[int]) -> list[str]:
    """Names of the context-length buckets: [512, 2048] -> ["0-512", "512-2048", "2048+"]."""
    edges = [0, *boundaries]
    return [f"{a}-{b}" for a, b in zip(edges, edges[1:], strict=False)] + [f"{edges[-1]}+"]


def check_boundaries(boundaries: Sequence[int]) -> list[int]:
    """The boundaries as a list; ValueError unless strictly increasing positive integers."""
    values = [int(b) for b in boundaries]
    if any(b <= 0 for b in values) or any(a >= b for a, b in zip(values, values[1:], strict=False)):
        raise ValueError(
            f"validate.context_buckets: {list(boundaries)} must be strictly increasing positive token counts"
        )
    return values


def special_token_ids(target_dir: str | Path) -> dict[str, int]:
    """Ids of the target tokenizer's added tokens (tokenizer_config.json's added_tokens_decoder, then
    tokenizer.json's added_tokens): `<think>` and `</think>` are single added tokens in Kimi, DeepSeek-R1
    and Qwen3 tokenizers. Empty when neither file lists any."""
    target_dir, found = Path(target_dir), {}
    config = target_dir / "tokenizer_config.json"
    if config.exists():
        for key, entry in (json.loads(config.read_text()).get("added_tokens_decoder") or {}).items():
            found.setdefault(entry.get("content"), int(key))
    tokenizer = target_dir / "tokenizer.json"
    if tokenizer.exists():
        for entry in json.loads(tokenizer.read_text()).get("added_tokens") or []:
            found.setdefault(entry.get("content"), int(entry["id"]))
    return found


def answer_start(input_ids: torch.Tensor, loss_mask: torch.Tensor, think: dict[str, int]) -> int | None:
    """Index of the reply's first answer token (after the `</think>` closing its thinking block): the
    completion's first `</think>` + 1; with none in it, the completion's start when the prompt left no
    thinking block open (thinking off), else len (all thinking, cut off). None without both tokens."""
    if THINK_START not in think or THINK_END not in think:
        return None
    ids, completion = input_ids.long(), loss_mask.bool()
    start = int(completion.nonzero()[0]) if completion.any() else len(ids)
    closes = ((ids == think[THINK_END]) & completion).nonzero()
    if len(closes):
        return int(closes[0]) + 1
    prompt = ids[:start]
    opened = (prompt == think[THINK_START]).nonzero()
    closed = (prompt == think[THINK_END]).nonzero()
    is_open = len(opened) and (not len(closed) or int(opened[-1]) > int(closed[-1]))
    return len(ids) if is_open else start


def slice_counts(
    right: np.ndarray, rows: np.ndarray, boundaries: Sequence[int], answer_from: int | None
) -> dict[str, dict[str, Any]]:
    """Per-slice {"anchors", "prefix"} of one sequence.

    Args:
        right: bool [anchors, steps], the kept anchors' per-step rightness against one reference.
        rows: int [anchors], each kept anchor's row i (its first guess is token i + 2).
        boundaries: context-length bucket boundaries (see `bucket_names`).
        answer_from: `answer_start`, or None (no thinking/answer split).
    """
    names = bucket_names(boundaries)
    bucket = np.searchsorted(np.asarray(boundaries, dtype=np.int64), rows + 2, side="right")
    groups = {f"context {name}": bucket == b for b, name in enumerate(names)}
    if answer_from is not None:
        groups |= {"thinking": rows + 2 < answer_from, "answer": rows + 2 >= answer_from}
    out = {}
    for name, chosen in groups.items():
        prefix, total = prefix_counts(right[chosen])
        out[name] = {"anchors": total, "prefix": prefix.tolist()}
    return out


def merge_slices(parts: Sequence[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Sum per-sequence slice counts (`slice_counts`) slice by slice."""
    merged: dict[str, dict[str, Any]] = {}
    for part in parts:
        for name, counts in part.items():
            into = merged.setdefault(name, {"anchors": 0, "prefix": [0] * len(counts["prefix"])})
            into["anchors"] += counts["anchors"]
            into["prefix"] = [a + b for a, b in zip(into["prefix"], counts["prefix"], strict=True)]
    return merged


def replay(
    guesses: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor, k: int, max_tokens: int | None
) -> dict[str, Any]:
    """Speculative decoding with `k` draft tokens replayed along one trace (module docstring).

    Args:
        guesses: [steps >= k, T] the draft's chained guesses at every row, as target ids.
        input_ids: [T] the token each guess is compared with at each position: the trace itself (sampled
            serving) or the target's argmax for it (greedy serving).
        loss_mask: [T] 1 over the reply.
        k: draft tokens per step (validate.num_speculative_tokens).
        max_tokens: the served requests' max_tokens: no draft once the reply has that many tokens.

    Returns:
        {"drafts", "accepted_per_position" [k]}: what vLLM's counters would add for this reply. A last
        draft reaching past the trace's end is left out (what follows a reply's end is unknown).
    """
    ids, mask = input_ids.long(), loss_mask.bool()
    accepted, drafts = [0] * k, 0
    anchors = max(len(ids) - 1 - k, 0)  # rows i whose k guesses x_{i+2}..x_{i+1+k} lie in the trace
    if not mask.any() or not anchors:
        return {"drafts": 0, "accepted_per_position": accepted}
    rows = torch.arange(anchors, device=ids.device)
    right = torch.stack([guesses[j, :anchors] == ids[rows + 2 + j] for j in range(k)], dim=1).cpu().numpy()
    first = int(mask.nonzero()[0])  # the reply's first token, sampled by the prefill
    row = first - 1  # the first draft reads it and guesses the next one
    while 0 <= row < anchors and (max_tokens is None or row + 2 - first < max_tokens):
        run = int(np.cumprod(right[row]).sum())  # accepted: the leading right guesses
        drafts += 1
        for j in range(run):
            accepted[j] += 1
        row += run + 1  # after the accepted ones, the target's own token, then the next draft
    return {"drafts": drafts, "accepted_per_position": accepted}
