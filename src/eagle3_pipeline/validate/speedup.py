"""validate.speedup on a local unit: the target served with and without the draft, both up at once,
timed in alternation.

One timed run is noise (a 1.5-second run, other work on the machine, a cold cache), so every
concurrency level (1, the check's, twice the check's: where speculative decoding pays and where the
batch takes over) is timed `validate.speedup_repeats` times (default 3) in each arm, the arms
alternating and the order flipped every repeat (with-without, without-with, ...) so that drift over the
run hits both alike. A level's run sends two rounds of its concurrency, at least MIN_REQUESTS
requests and at most every question (the first ones, in the check's order; `questions` per level): at
concurrency 1 a run is its requests one after another, so all 27 of the demo's questions there took
4 of the demo's 6 timing minutes and told no more about one request at a time than 8 do. Reported
per level: the median and range of output tokens/s in each arm, of their ratio over the paired
repeats, and the median time to first token and inter-token latency (vLLM's per-request metrics,
`--enable-per-request-metrics`). On vLLM's CPU build these are CPU figures, never a GPU claim
(`device`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

REPEATS = 3
MIN_REQUESTS = 8  # the fewest requests a level's run sends (when there are that many questions)

Asker = Callable[[str, list[dict[str, Any]], int], list[dict[str, Any]]]  # (base_url, questions, concurrency)


def concurrency_levels(check_concurrency: int, questions: int) -> list[int]:
    """1, the check's concurrency and twice it, each capped at the number of questions."""
    return sorted({1, min(check_concurrency, questions), min(2 * check_concurrency, questions)})


def level_questions(questions: list[dict[str, Any]], level: int) -> list[dict[str, Any]]:
    """What a run at concurrency `level` sends: the first max(2 x level, MIN_REQUESTS) questions, at most
    all of them (module docstring)."""
    return questions[: max(2 * level, MIN_REQUESTS)]


def timed_run(ask: Asker, base_url: str, questions: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    """One arm's run: output tokens/s over the wall time, and the answered requests' median time to
    first token and inter-token latency where the server reports them."""
    start = time.perf_counter()
    outcomes = ask(base_url, questions, concurrency)
    seconds = time.perf_counter() - start
    ok = [o for o in outcomes if o["status"] == "ok"]
    tokens = sum(o["completion_tokens"] or 0 for o in ok)
    timing = [o.get("timing") or {} for o in ok]
    return {
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
        "completion_tokens": tokens,
        "seconds": seconds,
        "answered": len(ok),
        "ttft_ms": _median([t.get("time_to_first_token_ms") for t in timing]),
        "itl_ms": _median([t.get("mean_itl_ms") for t in timing]),
    }


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _spread(values: list[float | None]) -> dict[str, float | None]:
    present = [v for v in values if v is not None]
    if not present:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(present), "min": min(present), "max": max(present)}


def alternate(
    ask: Asker,
    with_url: str,
    without_url: str,
    questions: list[dict[str, Any]],
    levels: list[int],
    repeats: int = REPEATS,
) -> dict[str, Any]:
    """Every level timed `repeats` times per arm, alternating (module docstring).

    Returns:
        {"by_concurrency": {c: {"questions" (sent per run), "with_draft", "without_draft" (spread of
        tokens/s, median ttft/itl), "speedup" (spread of the paired ratios), "runs"}}, "repeats"}.
    """
    by_level = {}
    for level in levels:
        runs, asked = [], level_questions(questions, level)
        for repeat in range(repeats):
            arms = [("with_draft", with_url), ("without_draft", without_url)]
            timed = {
                name: timed_run(ask, url, asked, level) for name, url in arms[:: 1 if repeat % 2 == 0 else -1]
            }
            runs.append(timed)
        ratios = [
            r["with_draft"]["tokens_per_s"] / r["without_draft"]["tokens_per_s"]
            for r in runs
            if r["with_draft"]["tokens_per_s"] and r["without_draft"]["tokens_per_s"]
        ]
        by_level[str(level)] = {
            "questions": len(asked),
            "speedup": _spread(ratios),
            **{
                arm: {
                    "tokens_per_s": _spread([r[arm]["tokens_per_s"] for r in runs]),
                    "ttft_ms": _median([r[arm]["ttft_ms"] for r in runs]),
                    "itl_ms": _median([r[arm]["itl_ms"] for r in runs]),
                }
                for arm in ("with_draft", "without_draft")
            },
            "runs": runs,
        }
    return {"by_concurrency": by_level, "repeats": repeats}


def headline(figures: dict[str, Any], check_concurrency: int, device: str) -> dict[str, Any]:
    """serve_check.json's "speedup": the median ratio at the check's concurrency (what the report and
    the former single run showed), every level's figures beside it, and what the figures are of."""
    levels = figures["by_concurrency"]
    at = levels.get(str(check_concurrency)) or levels[max(levels, key=int)]
    return {
        "speedup": at["speedup"]["median"],
        "speedup_range": [at["speedup"]["min"], at["speedup"]["max"]],
        "tokens_per_s_with_draft": at["with_draft"]["tokens_per_s"]["median"],
        "tokens_per_s_without_draft": at["without_draft"]["tokens_per_s"]["median"],
        "concurrency": check_concurrency,
        "device": device,
        **figures,
    }
