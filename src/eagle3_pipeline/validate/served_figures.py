"""The served figures: acceptance by dataset source (vLLM's counters are global, so each source is
measured alone), the run without a draft timed the same way, and the served speedup (output tokens/s
with the draft over without it).

Whether the served draft is the trained draft is the matched comparison (validate/matched.py: the
same questions replayed offline, per position, within validate.served_offline_tolerance plus Z
standard errors); this module reports its disagreement (`disagreement_message`) and the allowance
a comparison is reported with when it is not enforced (`REPORTED_TOLERANCE`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from eagle3_pipeline.server.draft_command import ServeCheckError
from eagle3_pipeline.settings import ValidateSettings, field_default
from eagle3_pipeline.validate.acceptance import online_acceptance
from eagle3_pipeline.validate.metrics import SpecDecodeCounters
from eagle3_pipeline.validate.spec_decode import with_interval

# The allowance a comparison is reported with when validate.served_offline_tolerance is null (not
# enforced): the schema's default, measured (docs/validation.md).
REPORTED_TOLERANCE = field_default(ValidateSettings, "served_offline_tolerance")
UNKNOWN_SOURCE = "unknown"


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
