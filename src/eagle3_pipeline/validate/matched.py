"""The serve check's matched comparison: vLLM's acceptance per position on replies to the validation
questions against the same run replayed offline along those questions' validation traces
(validate/slices.py): the same questions, the same draft positions (where vLLM drafts, after each
verification step), the same max_tokens and the same acceptance rule (greedy: the target's argmax;
sampled: the trace's token, accepted with the same probability).

Per position i, with r the replayed rate (drafts whose first i+1 tokens were accepted / drafts) over D
replayed drafts and d served drafts:

    |served_i - r| <= tolerance + Z * sqrt(r(1-r)/D + r(1-r)/d)

Both sides ask the same questions, so how hard each question is cancels out; what remains is taken here
as binomial over drafts. Drafts within one reply are correlated (a repetitive stretch is accepted
throughout), so this understates the noise somewhat: the systematic allowance
(validate.served_offline_tolerance; bf16 kernels against the fp32 replay, a greedy reply leaving the
sampled trace's context, the last draft of each reply, which the replay leaves out) absorbs that too
and is set from matched runs (docs/validation.md). A draft served with another vocabulary map, norm or
layer than it was trained with falls below it wherever that costs acceptance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

Z = 3.0  # standard errors allowed per position (about 1 in 370 each)


def replayed_counts(offline: Mapping[str, Any], ids: Sequence[str], reference: str) -> list[dict[str, Any]]:
    """The replayed counts of the given questions against `reference` ("greedy": the target's argmax,
    "sampled": the trace's tokens; offline.json "served_replay"), in `ids` order."""
    samples = offline["served_replay"]["samples"]
    return [samples[i][reference] for i in ids]


def reference_of(sampling: Mapping[str, Any]) -> str:
    """Which replay a served run matches: "greedy" at temperature 0, else "sampled"."""
    return "greedy" if sampling.get("temperature") == 0 else "sampled"


def replayed_rate(replayed: Sequence[Mapping[str, Any]], position: int) -> tuple[float | None, int]:
    """(drafts whose first position+1 tokens were accepted / drafts, drafts) over the replayed questions."""
    drafts = sum(int(r["drafts"]) for r in replayed)
    accepted = sum(int(r["accepted_per_position"][position]) for r in replayed)
    return (accepted / drafts if drafts else None), drafts


def compare_matched(
    served: Mapping[str, Any], replayed: Sequence[Mapping[str, Any]], tolerance: float, z: float = Z
) -> dict[str, Any]:
    """Served (serve_check's "sampled" figures: per_position_rate, drafts) against the replay of the same
    questions, position by position (module docstring)."""
    served_drafts, positions = int(served.get("drafts") or 0), []
    for i, served_rate in enumerate(served.get("per_position_rate") or []):
        rate, drafts = replayed_rate(replayed, i)
        if served_rate is None or rate is None:
            continue
        variance = rate * (1 - rate)
        error = math.sqrt(variance / drafts + variance / max(served_drafts, 1))
        allowed = tolerance + z * error
        positions.append(
            {
                "position": i,
                "served": served_rate,
                "offline": rate,
                "difference": served_rate - rate,
                "standard_error": error,
                "allowed": allowed,
                "agree": abs(served_rate - rate) <= allowed,
            }
        )
    return {
        "agree": bool(positions) and all(p["agree"] for p in positions),
        "matched": "served against the same run replayed along the questions' traces",
        "tolerance": tolerance,
        "z": z,
        "drafts": served_drafts,
        "anchors": sum(int(r["drafts"]) for r in replayed),  # the replay's drafts
        "questions": len(replayed),
        "positions": positions,
    }
