"""What every way of serving the draft shares: the draft-serving command line, the questions asked
through the chat API as generation asks them, the spec-decode counters read around them, a local
draft server, the error type and the redacted JSON writer.

serve_check.py runs the check; dropin.py (production, over SSH), served.py (per-source figures, the
speedup, the offline comparison) and remote_checkpoint.py build on the pieces here, so none of them
imports serve_check.py and serve_check.py imports each of them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from eagle3_pipeline import io
from eagle3_pipeline.generate.client import ChatClient, Sampling
from eagle3_pipeline.ports import reserved_port
from eagle3_pipeline.server.secrets import redact_data
from eagle3_pipeline.validate.acceptance import online_acceptance
from eagle3_pipeline.validate.metrics import SpecDecodeCounters, read_counters

log = logging.getLogger(__name__)

# Flags the serve check sets itself; the unit's own values are dropped (both spellings, both forms).
REPLACED_FLAGS = ("--speculative-config", "--host", "--port")
BOOLEAN_REPLACED = ("--enforce-eager",)


class ServeCheckError(RuntimeError):
    """The served check could not measure anything; the message says what to fix."""


def _canonical(word: str) -> str:
    return word.split("=", 1)[0].replace("_", "-") if word.startswith("--") else word


def with_speculative_draft(
    vllm_words: list[str],
    checkpoint_dir: str,
    num_speculative_tokens: int,
    host: str | None = None,
    port: int | None = None,
    enforce_eager: bool = True,
) -> list[str]:
    """The vLLM words of a command line with the EAGLE-3 draft added (and host/port replaced when given).

    Args:
        vllm_words: the whole argv (launcher included); its flags follow the vLLM entry point.
        checkpoint_dir: the exported draft, as a path the server can read (made absolute here).
        num_speculative_tokens: draft tokens per step.
        host: listen address to set, or None to keep the unit's.
        port: port to set, or None to keep the unit's.
        enforce_eager: add --enforce-eager (needed on the CPU build: without it vLLM 0.32 feeds the
            draft's fc 1x hidden instead of 3x).
    """
    drop = {"--speculative-config"} | ({"--host"} if host else set()) | ({"--port"} if port else set())
    words, skip = [], False
    for word in vllm_words:
        if skip:
            skip = False
            continue
        name = _canonical(word)
        if name in drop:
            skip = "=" not in word
            continue
        words.append(word)
    spec = {
        "method": "eagle3",
        "model": os.path.abspath(checkpoint_dir),
        "num_speculative_tokens": num_speculative_tokens,
    }
    words += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    words += ["--host", host] if host else []
    words += ["--port", str(port)] if port else []
    if enforce_eager and "--enforce-eager" not in {_canonical(w) for w in words}:
        words.append("--enforce-eager")
    return words


def load_questions(validation_path: str | Path, max_questions: int) -> list[dict[str, Any]]:
    """The validation questions (id, system, question, source), the first `max_questions` by id.

    Raises:
        ServeCheckError: the file has no questions.
    """
    columns = ["id", "system", "question"]
    if "source" in pl.read_parquet_schema(validation_path):  # acceptance by source (validate/served.py)
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
    return {
        **acceptance.to_dict(),
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


PORT_ATTEMPTS = 3


def serve_local(
    command_on: Callable[[int], list[str]],
    env: dict[str, str],
    cwd: str | None,
    state_dir: Path,
    timeout_s: float,
    port_range: tuple[int, int],
) -> tuple[Any, str]:
    """Start the draft-serving command (`command_on(port)`, see `with_speculative_draft`) as a local
    process on a free port of `port_range` and wait for /health; returns (its handle, its base URL): the
    caller stops it.

    The port stays reserved until the server answers (`reserved_port`: another check starting on this
    host at the same moment picks another one). A program that ignores the reservation could still
    take it: the server that answers must hold the port itself (its process group's socket), or it is
    stopped and another port tried, so that a check never measures somebody else's server.
    """
    from eagle3_pipeline.server import lifecycle
    from eagle3_pipeline.server.process_identity import group_listens_on

    for attempt in range(1, PORT_ATTEMPTS + 1):
        with reserved_port(*port_range) as port:
            base_url = f"http://127.0.0.1:{port}"
            handle = lifecycle.launch_local(command_on(port), env, cwd, state_dir, "serve-check")
            try:
                lifecycle.wait_healthy(base_url, timeout_s, handle.log_tail, handle.alive)
            except BaseException:
                handle.stop()
                raise
        if group_listens_on(handle.pid, port) is not False:
            return handle, base_url
        handle.stop()
        log.warning("port %d is served by another process (attempt %d): trying another", port, attempt)
    raise ServeCheckError(
        f"every port tried in {port_range[0]}-{port_range[1]} was taken by another server while vLLM "
        "started; stop the servers that listen there"
    )


def write_json(data: dict[str, Any], path: str | Path) -> None:
    """Write JSON atomically (a temporary file renamed into place), the unit's secrets redacted as
    values (a vLLM error or log tail in the figures can carry one)."""
    io.write_json(redact_data(data), path, indent=2, sort_keys=True)
