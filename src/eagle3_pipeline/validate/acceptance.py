"""The acceptance arithmetic, offline (from per-step correctness) and online (from vLLM's counters).

Speculative decoding accepts a prefix: draft token i counts only when every earlier one was accepted.
So the figure that matters per position is the *conditional* rate

    p_i = P(step i right | steps 0..i-1 right)

and the expected tokens per target forward pass with k draft tokens (the "acceptance length", the
bonus token included) is

    tau(k) = 1 + sum_{i=1..k} prod_{j=1..i} p_j.

vLLM counts, per draft position i, the drafts whose first i+1 tokens were all accepted
(`..._accepted_tokens_per_pos{position=i}`), so its rate per position is prod_{j<=i} p_j and the
acceptance length is 1 + accepted / drafts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from eagle3_pipeline.validate.metrics import SpecDecodeCounters


def prefix_counts(correct: np.ndarray) -> tuple[np.ndarray, int]:
    """How many rows have their first i+1 steps all right, for each step i.

    Args:
        correct: bool [N, k]; row n, column i: draft step i right at anchor n.

    Returns:
        (counts int64 [k], N).
    """
    correct = np.asarray(correct, dtype=bool)
    if correct.ndim != 2:
        raise ValueError(f"correct must be 2-D [anchors, steps], got shape {correct.shape}")
    return np.cumprod(correct, axis=1).sum(axis=0).astype(np.int64), int(correct.shape[0])


def conditional_rates(prefix: Sequence[int], total: int) -> list[float | None]:
    """p_i = prefix[i] / prefix[i-1] (prefix[-1] = total); None where no row reached step i."""
    rates: list[float | None] = []
    previous = total
    for count in prefix:
        rates.append(float(count) / previous if previous > 0 else None)
        previous = int(count)
    return rates


def acceptance_lengths(conditional: Sequence[float | None]) -> list[float]:
    """tau(k) for k = 1..len(conditional): 1 + sum_{i<=k} prod_{j<=i} p_j (None counts as 0)."""
    lengths, survive, total = [], 1.0, 1.0
    for rate in conditional:
        survive *= rate or 0.0
        total += survive
        lengths.append(total)
    return lengths


@dataclass(frozen=True)
class OfflineAcceptance:
    """Offline acceptance over `anchors` positions, steps numbered from 0 (the first draft token)."""

    anchors: int
    step_accuracy: list[float | None]  # P(step i right), unconditional
    conditional: list[float | None]  # P(step i right | earlier steps right)
    acceptance_length: list[float]  # tau(k) for k = 1..steps

    def to_dict(self) -> dict:
        return asdict(self)


def offline_acceptance(prefix: Sequence[int], step_right: Sequence[int], anchors: int) -> OfflineAcceptance:
    """Summarise accumulated counts (see `prefix_counts`) of one or many shards.

    Args:
        prefix: per step, anchors whose steps 0..i were all right.
        step_right: per step, anchors whose step i was right (whatever the earlier steps did).
        anchors: anchors measured.
    """
    conditional = conditional_rates(prefix, anchors)
    return OfflineAcceptance(
        anchors=anchors,
        step_accuracy=[c / anchors if anchors else None for c in step_right],
        conditional=conditional,
        acceptance_length=acceptance_lengths(conditional),
    )


@dataclass(frozen=True)
class OnlineAcceptance:
    """What vLLM's counters say about the requests measured (deltas of the counters around them)."""

    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: list[int]
    acceptance_length: float | None  # 1 + accepted / drafts
    draft_acceptance_rate: float | None  # accepted / draft tokens
    per_position_rate: list[float | None]  # accepted at position i / drafts = prod_{j<=i} p_j
    conditional: list[float | None]  # p_i

    def to_dict(self) -> dict:
        return asdict(self)


def online_acceptance(before: SpecDecodeCounters, after: SpecDecodeCounters) -> OnlineAcceptance:
    """Acceptance from two /metrics readings taken before and after the measured requests.

    Raises:
        ValueError: a counter went down (the server restarted between the readings).
    """
    delta = after.minus(before)
    drafts = delta.drafts
    per_pos = list(delta.accepted_per_position)
    return OnlineAcceptance(
        drafts=drafts,
        draft_tokens=delta.draft_tokens,
        accepted_tokens=delta.accepted_tokens,
        accepted_per_position=per_pos,
        acceptance_length=1.0 + delta.accepted_tokens / drafts if drafts else None,
        draft_acceptance_rate=delta.accepted_tokens / delta.draft_tokens if delta.draft_tokens else None,
        per_position_rate=[c / drafts if drafts else None for c in per_pos],
        conditional=conditional_rates(per_pos, drafts),
    )


def merge_counts(parts: Sequence[Mapping[str, Sequence[int] | int]]) -> dict[str, list[int] | int]:
    """Sum per-shard counts {"anchors", "prefix", "step_right"} element-wise."""
    if not parts:
        raise ValueError("no counts to merge: no validation shard had a loss-masked position")
    steps = len(parts[0]["prefix"])
    merged = {"anchors": 0, "prefix": [0] * steps, "step_right": [0] * steps}
    for part in parts:
        merged["anchors"] += int(part["anchors"])
        for key in ("prefix", "step_right"):
            merged[key] = [a + int(b) for a, b in zip(merged[key], part[key], strict=True)]
    return merged
