"""Is the served draft the trained draft? Served acceptance against the offline simulation, by dataset
source, and the served speedup (output tokens/s with the draft over without it).

Served and offline per position. vLLM counts, per draft position i, the drafts whose first i+1 tokens
were all accepted; offline.py counts, per step i, the anchors whose first i+1 greedy guesses were all
the target's argmax. Their ratios (to drafts, to anchors) estimate the same thing, prod_{j<=i} p_j,
when vLLM runs the draft that was trained, on the layers it was trained on, greedily. They still
differ a little for honest reasons: vLLM drafts only where a verification step begins (after an
accepted run) while offline anchors every completion position; offline runs over the validation
traces (sampled at generation.temperature, up to generation.max_tokens) while the served replies are
greedy and capped at validate.max_tokens; bf16 kernels against the fp32 simulation. A draft fed
the wrong layers, a wrong vocabulary map or other weights is accepted far less (vLLM PR 50170: an
off-by-one in the layer ids took acceptance to ~1.04). The check allows, per position,

    |served_i - offline_i| <= tolerance + Z * sqrt(r(1-r)/drafts + r(1-r)/anchors),  r = offline_i

a systematic allowance (validate.served_offline_tolerance, measured: docs/validation.md) plus Z
binomial standard errors of the two estimates, and fails the serve check beyond it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from eagle3_pipeline.server.dropin import ServeCheckError
from eagle3_pipeline.settings import ValidateSettings, field_default
from eagle3_pipeline.validate.acceptance import online_acceptance
from eagle3_pipeline.validate.metrics import SpecDecodeCounters
from eagle3_pipeline.validate.spec_decode import with_interval

Z = 3.0  # standard errors allowed on top of the systematic tolerance (about 1 in 370 per position)
# The allowance a comparison is reported with when validate.served_offline_tolerance is null (not
# enforced): the schema's default, measured (docs/validation.md).
REPORTED_TOLERANCE = field_default(ValidateSettings, "served_offline_tolerance")
UNKNOWN_SOURCE = "unknown"


def offline_rates(offline: dict[str, Any]) -> list[float | None]:
    """prod_{j<=i} p_j per step from offline.json: anchors whose steps 0..i were all right / anchors."""
    anchors = offline.get("anchors") or 0
    return [c / anchors if anchors else None for c in offline.get("prefix_counts", [])]


def compare_with_offline(served: dict[str, Any], offline: dict[str, Any], tolerance: float) -> dict[str, Any]:
    """Served and offline acceptance per position, and whether they agree (module docstring).

    Args:
        served: serve_check.json's figures (per_position_rate, drafts).
        offline: offline.json (prefix_counts, anchors).
        tolerance: the systematic allowance per position (an absolute rate).
    """
    drafts, anchors = served.get("drafts") or 0, offline.get("anchors") or 0
    positions = []
    for i, (served_rate, offline_rate) in enumerate(
        zip(served.get("per_position_rate") or [], offline_rates(offline), strict=False)
    ):
        if served_rate is None or offline_rate is None:
            continue
        variance = offline_rate * (1 - offline_rate)
        error = math.sqrt(variance / max(drafts, 1) + variance / max(anchors, 1))
        allowed = tolerance + Z * error
        difference = served_rate - offline_rate
        positions.append(
            {
                "position": i,
                "served": served_rate,
                "offline": offline_rate,
                "difference": difference,
                "allowed": allowed,
                "agree": abs(difference) <= allowed,
            }
        )
    return {
        "agree": bool(positions) and all(p["agree"] for p in positions),
        "tolerance": tolerance,
        "z": Z,
        "drafts": drafts,
        "anchors": anchors,
        "positions": positions,
    }


def disagreement_message(comparison: dict[str, Any]) -> str:
    """What failed, per position, and what it usually means."""
    bad = [p for p in comparison["positions"] if not p["agree"]]
    if not comparison["positions"]:
        return "no position to compare: the server drafted nothing or offline.json has no anchors"
    lines = [
        f"position {p['position']}: served {p['served']:.3f} vs offline {p['offline']:.3f} "
        f"(allowed +-{p['allowed']:.3f})"
        for p in bad
    ]
    return (
        "the served draft does not behave like the trained one: "
        + "; ".join(lines)
        + ". Check the auxiliary layer ids vLLM uses (its log: 'Using auxiliary layers'), the checkpoint "
        "served and the vocabulary map; validate.served_offline_tolerance sets the allowance"
    )


def source_groups(questions: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The questions by their dataset source (maths, code, chat, ...), sources in sorted order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for question in questions:
        groups.setdefault(str(question.get("source") or UNKNOWN_SOURCE), []).append(question)
    return dict(sorted(groups.items()))


def _counters(reading: dict[str, Any]) -> SpecDecodeCounters:
    return SpecDecodeCounters(
        reading["drafts"],
        reading["draft_tokens"],
        reading["accepted_tokens"],
        tuple(reading["accepted_per_position"]),
    )


def measure_by_source(
    measure: Callable[[list[dict[str, Any]]], dict[str, Any]], questions: list[dict[str, Any]]
) -> dict[str, Any]:
    """Run `measure` (spec_decode.measure bound to a server) once per source, one source after the other:
    vLLM's counters are global, so per-source acceptance needs each source's requests alone. The whole
    figure is the counters from before the first measured group to after the last; tokens/s is all
    completion tokens over the groups' summed wall time (concurrency applies within a group). A source
    none of whose questions was answered (or drafted) is reported with its error, not fatal.

    Raises:
        ServeCheckError: no source was measured (the first source's error).
    """
    by_source, errors = {}, {}
    for source, group in source_groups(questions).items():
        try:
            by_source[source] = measure(group)
        except ServeCheckError as error:
            errors[source] = {"questions": len(group), "answered": 0, "error": str(error)}
    if not by_source:
        raise ServeCheckError(next(iter(errors.values()))["error"])
    parts = list(by_source.values())
    overall = online_acceptance(
        _counters(parts[0]["counters_before"]), _counters(parts[-1]["counters_after"])
    )
    tokens, seconds = sum(p["completion_tokens"] for p in parts), sum(p["seconds"] for p in parts)
    keys = ("questions", "answered", "drafts", "acceptance_length", "per_position_rate")
    keys += ("completion_tokens", "seconds", "tokens_per_s", "ci95")
    per_question = {k: v for p in parts for k, v in (p.get("per_question") or {}).items()}
    return {
        **overall.to_dict(),
        **with_interval(per_question),
        "questions": len(questions),
        "answered": sum(p["answered"] for p in parts),
        "failed": {k: v for p in parts for k, v in p["failed"].items()},
        "completion_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
        "counters_before": parts[0]["counters_before"],
        "counters_after": parts[-1]["counters_after"],
        "by_source": {
            source: {key: part[key] for key in keys if key in part} for source, part in by_source.items()
        }
        | errors,
    }


def speedup(with_draft: dict[str, Any], without_draft: dict[str, Any]) -> dict[str, Any]:
    """Output tokens/s with the draft over without it (same questions, same concurrency), overall and
    per source where both runs have it."""

    def ratio(a: dict[str, Any], b: dict[str, Any]) -> float | None:
        return (
            a["tokens_per_s"] / b["tokens_per_s"] if a.get("tokens_per_s") and b.get("tokens_per_s") else None
        )

    def timed(run: dict[str, Any]) -> set[str]:
        return {k for k, v in run.get("by_source", {}).items() if v.get("tokens_per_s")}

    sources = timed(with_draft) & timed(without_draft)
    return {
        "speedup": ratio(with_draft, without_draft),
        "tokens_per_s_with_draft": with_draft.get("tokens_per_s"),
        "tokens_per_s_without_draft": without_draft.get("tokens_per_s"),
        "completion_tokens_without_draft": without_draft.get("completion_tokens"),
        "by_source": {
            s: ratio(with_draft["by_source"][s], without_draft["by_source"][s]) for s in sorted(sources)
        },
    }


def time_by_source(
    ask: Callable[[list[dict[str, Any]]], list[dict[str, Any]]], questions: list[dict[str, Any]]
) -> dict[str, Any]:
    """Completion tokens and wall time of `ask` (spec_decode.ask bound to a server), source by source as
    `measure_by_source` groups them: the run without a draft, which has no spec-decode counters."""
    by_source = {}
    for source, group in source_groups(questions).items():
        start = time.perf_counter()
        outcomes = ask(group)
        seconds = time.perf_counter() - start
        tokens = sum(o["completion_tokens"] or 0 for o in outcomes if o["status"] == "ok")
        answered = sum(o["status"] == "ok" for o in outcomes)
        by_source[source] = {"questions": len(group), "answered": answered, "completion_tokens": tokens}
        by_source[source] |= {"seconds": seconds, "tokens_per_s": tokens / seconds if seconds > 0 else None}
    tokens = sum(p["completion_tokens"] for p in by_source.values())
    seconds = sum(p["seconds"] for p in by_source.values())
    return {
        "answered": sum(p["answered"] for p in by_source.values()),
        "completion_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
        "by_source": by_source,
    }
