"""The validation questions sent to a served draft through the chat API, as generation sends them, with
vLLM's spec-decode counters read before and after: the serve check's measurement.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from eagle3_pipeline.draft_config import read_checkpoint_config
from eagle3_pipeline.generate.client import ChatClient, Sampling
from eagle3_pipeline.server.draft_command import ServeCheckError
from eagle3_pipeline.validate.acceptance import online_acceptance
from eagle3_pipeline.validate.metrics import SpecDecodeCounters, read_counters


def load_questions(validation_path: str | Path, max_questions: int) -> list[dict[str, Any]]:
    """The validation questions (id, system, question, source), the first `max_questions` by id.

    Raises:
        ServeCheckError: the file has no questions.
    """
    columns = ["id", "system", "question"]
    if "source" in pl.read_parquet_schema(validation_path):  # acceptance by source (served_figures.py)
        columns.append("source")
    frame = pl.read_parquet(validation_path, columns=columns).sort("id")
    if frame.is_empty():
        raise ServeCheckError(
            f"{validation_path} has no questions: raise dataset.num_samples or traces.validation_fraction"
        )
    return frame.head(max_questions).to_dicts()


def ask(
    base_url: str,
    questions: list[dict],
    sampling: Sampling,
    api_key: str | None,
    concurrency: int,
    request_timeout_s: float,
    retries: int,
    ca_bundle: str | None = None,
) -> list[dict[str, Any]]:
    """Send every question (at most `concurrency` in flight); one outcome dict per question, in order."""
    client = ChatClient(
        base_url,
        sampling,
        api_key=api_key,
        retries=retries,
        request_timeout_s=request_timeout_s,
        health_timeout_s=request_timeout_s,
        ca_bundle=ca_bundle,
    )

    async def run() -> list[dict[str, Any]]:
        gate = asyncio.Semaphore(max(1, concurrency))

        async def one(question: dict) -> dict[str, Any]:
            async with gate:
                return await client.complete(question)

        try:
            return list(await asyncio.gather(*(one(q) for q in questions)))
        finally:
            await client.close()

    return asyncio.run(run())


# vLLM's V1 runner (the CPU build): "Using auxiliary layers from speculative config: (2, 4, 5)"; Model
# Runner V2 (CUDA): "Using Eagle3 auxiliary layers from config: ..." or "... from model: ..." (its default)
_AUX_LAYERS_LOGGED = re.compile(
    r"Using (?:Eagle3 )?auxiliary layers from (speculative config|config|model): \(([\d,\s]*)\)"
)


def served_layers(server_log: str, checkpoint_dir: str | Path) -> dict[str, Any]:
    """The auxiliary layer ids vLLM says it feeds the draft (its start-up log) against the ids the draft
    was trained on (its config.json's `eagle_aux_hidden_state_layer_ids`, vLLM's numbering).

    Raises:
        ServeCheckError: vLLM uses other layers than the trained ones (an off-by-one here cut acceptance
            to ~1.04 in vLLM PR 50170); nothing is measured on such a server.
    """
    trained = read_checkpoint_config(checkpoint_dir).aux_layer_ids
    found = _AUX_LAYERS_LOGGED.findall(server_log)
    if not found:
        return {"trained": trained, "served": None, "source": "vLLM logged no auxiliary layer ids"}
    origin, ids = found[-1]
    served = [int(i) for i in ids.replace(" ", "").split(",") if i]
    if trained is not None and served != list(trained):
        raise ServeCheckError(
            f"vLLM feeds the draft auxiliary layers {served} (from the {origin}) but it was trained on "
            f"{list(trained)}: check eagle_aux_hidden_state_layer_ids in {checkpoint_dir}/config.json and "
            "hidden_states.layers"
        )
    return {"trained": trained, "served": served, "source": f"vLLM's log (from the {origin})"}


def question_counts(spec: dict[str, Any]) -> dict[str, Any]:
    """One reply's draft counts from vLLM's per-request metrics (`metrics.speculative_decoding`): its
    verify steps (drafts) and how many accepted their first i+1 tokens, the counters' own shape.
    `acceptance_histogram[j]` counts the steps that accepted exactly j draft tokens."""
    histogram = [int(n) for n in spec["acceptance_histogram"]]
    k = len(histogram) - 1
    return {"drafts": sum(histogram), "accepted_per_position": [sum(histogram[i + 1 :]) for i in range(k)]}


def with_interval(per_question: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A served run's per-question counts and the question-level 95% interval of its acceptance length
    at the served k (validate/intervals.py); nothing when the server gave no per-request metrics."""
    from eagle3_pipeline.validate.intervals import acceptance_interval

    if not per_question:
        return {}
    interval = acceptance_interval([(c["drafts"], c["accepted_per_position"]) for c in per_question.values()])
    return {
        "per_question": per_question,
        "ci95": interval["ci95"][-1] if interval["ci95"] else None,
        "interval": {key: interval[key] for key in ("questions", "draws", "seed", "unit")},
    }


def settled_counters(
    read: Callable[[], SpecDecodeCounters], interval_s: float = 0.5, timeout_s: float = 15.0
) -> SpecDecodeCounters:
    """Read the counters until two readings agree (the engine's last steps are counted)."""
    previous, start = read(), time.monotonic()
    while time.monotonic() - start < timeout_s:
        time.sleep(interval_s)
        current = read()
        if current == previous:
            return current
        previous = current
    return previous


def measure(
    base_url: str,
    questions: list[dict],
    sampling: Sampling,
    api_key: str | None = None,
    concurrency: int = 8,
    request_timeout_s: float = 600.0,
    retries: int = 2,
    ca_bundle: str | None = None,
) -> dict[str, Any]:
    """Counters before, the questions, counters after: the serve check's figures (`ca_bundle`: the
    PEM file an https server is verified with, server.ca_bundle).

    Raises:
        ServeCheckError: no question was answered, or the server drafted nothing.
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    verify = ca_bundle or True
    before = settled_counters(lambda: read_counters(base_url, headers=headers, verify=verify))
    start = time.perf_counter()
    outcomes = ask(base_url, questions, sampling, api_key, concurrency, request_timeout_s, retries, ca_bundle)
    seconds = time.perf_counter() - start
    after = settled_counters(lambda: read_counters(base_url, headers=headers, verify=verify))
    ok = [o for o in outcomes if o["status"] == "ok"]
    if not ok:
        reasons = sorted({str(o["reason"]) for o in outcomes})[:3]
        raise ServeCheckError(f"no validation question was answered by {base_url}: {reasons}")
    acceptance = online_acceptance(before, after)
    if acceptance.drafts == 0:
        raise ServeCheckError(f"{base_url} answered but drafted nothing: is --speculative-config applied?")
    completion_tokens = sum(o["completion_tokens"] or 0 for o in ok)
    per_question = {
        q["id"]: question_counts(o["spec_decode"])
        for q, o in zip(questions, outcomes, strict=True)
        if o["status"] == "ok" and o.get("spec_decode")
    }
    return {
        **acceptance.to_dict(),
        **with_interval(per_question),
        "questions": len(questions),
        "answered": len(ok),
        "failed": {
            o_q["id"]: o["reason"] for o_q, o in zip(questions, outcomes, strict=True) if o["status"] != "ok"
        },
        "completion_tokens": completion_tokens,
        "seconds": seconds,
        "tokens_per_s": completion_tokens / seconds if seconds > 0 else None,
        "counters_before": before.__dict__ | {"accepted_per_position": list(before.accepted_per_position)},
        "counters_after": after.__dict__ | {"accepted_per_position": list(after.accepted_per_position)},
    }
