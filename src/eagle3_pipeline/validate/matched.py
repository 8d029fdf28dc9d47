"""The serve check's matched comparison: vLLM's acceptance per position on replies to the validation
questions against the same run replayed offline along those questions' validation traces
(validate/slices.py): the same questions, the same draft positions (where vLLM drafts, after each
verification step), the same max_tokens and the same acceptance rule (greedy: the target's argmax;
sampled: the trace's token, accepted with the same probability).

Per position i, the served share of drafts whose first i+1 tokens were accepted is compared with the
replayed share over the same questions:

    |served_i - replayed_i| <= tolerance + Z * SE_i

where SE_i is the paired question-level bootstrap standard error of served minus replayed
(validate/intervals.py): both sides are resampled by question together, so how hard each question is
cancels, and drafts within one reply are not taken as independent (they are not: a repetitive stretch
is accepted throughout; the binomial error over drafts understated the noise about 2.4-fold). The
served side comes from vLLM's per-request counts (`--per-request-spec-decode-metrics`, vLLM >= 0.32);
a server without them falls back to the binomial error over drafts, sqrt(r(1-r)/D + r(1-r)/d), and
says so ("allowance"). The systematic allowance (validate.served_offline_tolerance: bf16 kernels
against the fp32 replay, a greedy reply leaving the sampled trace's context, the last draft of each
reply, which the replay leaves out) is set from matched runs (docs/validation.md). A draft served
with another vocabulary map, norm, layer or epoch than the replay's falls below it wherever that costs
acceptance; one served far above its replay is refused as well (the check is two-sided).
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
    served: Mapping[str, Any],
    replayed: Sequence[Mapping[str, Any]],
    tolerance: float,
    z: float = Z,
    ids: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Served (a serve_check run's figures: per_position_rate, drafts, and per_question when the server
    gave per-request counts) against the replay of the same questions (`replayed`, in `ids` order),
    position by position (module docstring)."""
    paired = _paired(served, replayed, ids)
    served_drafts, positions = int(served.get("drafts") or 0), []
    for i, served_rate in enumerate(served.get("per_position_rate") or []):
        rate, drafts = replayed_rate(replayed, i)
        if served_rate is None or rate is None:
            continue
        if paired is not None:
            difference, error = paired["difference"][i], paired["standard_error"][i]
            served_rate = rate + difference  # over the paired questions' own counts
        else:
            variance = rate * (1 - rate)
            difference = served_rate - rate
            error = math.sqrt(variance / drafts + variance / max(served_drafts, 1))
        allowed = tolerance + z * error
        positions.append(
            {
                "position": i,
                "served": served_rate,
                "offline": rate,
                "difference": difference,
                "standard_error": error,
                "allowed": allowed,
                "agree": abs(difference) <= allowed,
            }
            | ({"ci95": paired["ci95"][i]} if paired is not None else {})
        )
    allowance = (
        f"paired question bootstrap ({paired['draws']} draws, seed {paired['seed']})"
        if paired is not None
        else "binomial over drafts (the server gave no per-request counts)"
    )
    return {
        "agree": bool(positions) and all(p["agree"] for p in positions),
        "matched": "served against the same run replayed along the questions' traces",
        "allowance": allowance,
        "tolerance": tolerance,
        "z": z,
        "drafts": served_drafts,
        "anchors": sum(int(r["drafts"]) for r in replayed),  # the replay's drafts
        "questions": len(replayed),
        "positions": positions,
    }


def _paired(
    served: Mapping[str, Any], replayed: Sequence[Mapping[str, Any]], ids: Sequence[str] | None
) -> dict[str, Any] | None:
    """The paired bootstrap of served minus replayed over the questions both sides counted, or None
    when the served run has no per-question counts for them (or too few questions to resample)."""
    from eagle3_pipeline.validate.intervals import paired_differences

    per_question = served.get("per_question") or {}
    if ids is None or not per_question:
        return None
    pairs = [(per_question[i], r) for i, r in zip(ids, replayed, strict=True) if i in per_question]
    if len(pairs) < 2:
        return None
    return paired_differences(
        [(s["drafts"], s["accepted_per_position"]) for s, _ in pairs],
        [(r["drafts"], r["accepted_per_position"][: len(s["accepted_per_position"])]) for s, r in pairs],
    )
