"""The checks before any shard sends a question: one short request and the prompts' token counts.

Rule preflight_generation runs once per run (every generation shard depends on its small output), for
the primary server and every server.replicas entry at once, and refuses in seconds what would
otherwise be found only at the merge, after the whole generation:
- the served model name does not answer (/v1/models lists what the server serves);
- the server ignores `return_token_ids` (vLLM < 0.10.2): no trace could be kept;
- server.json names a reasoning parser but the reply carries no reasoning (unless
  generation.chat_template_kwargs switches thinking off);
- generation.max_tokens leaves no room for a prompt within the server's max_model_len.
It also counts, with the server's /tokenize (the exact chat template), how many selected prompts do
not fit max_model_len with max_tokens: the longest PREFLIGHT_COUNTED by characters are counted, the
rest are shorter. Those prompts will be `skipped`; the number is logged and written, not an error.

The output holds only what the checks found (no timings), so rewriting it unchanged triggers nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from eagle3_pipeline import io
from eagle3_pipeline.generate.http import Http
from eagle3_pipeline.generate.payload import Sampling, chat_body, chat_messages
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.settings import GenerationSettings, ServerSettings

if TYPE_CHECKING:
    from eagle3_pipeline.server.replicas import Server

log = logging.getLogger(__name__)

PROBE = {"id": "preflight", "system": None, "question": "What is 12 + 30? Answer briefly."}
PROBE_MAX_TOKENS = 32  # enough for a reasoning parser to have opened the thinking block
PREFLIGHT_COUNTED = 2048  # prompts counted exactly with /tokenize (the longest by characters)
COUNT_CONCURRENCY = 16


class PreflightError(RuntimeError):
    """The server cannot produce usable traces with this config; the message names the fix."""


def check_probe_reply(data: Any, reasoning_parser: str | None, sampling: Sampling) -> dict[str, Any]:
    """What the probe's 200 reply proves; PreflightError when token ids or reasoning are missing."""
    choice = (data.get("choices") or [{}])[0] if isinstance(data, dict) else {}
    if not isinstance(data, dict) or not isinstance(choice, dict) or "message" not in choice:
        raise PreflightError(f"the server's reply is not a chat completion: {json.dumps(data)[:300]}")
    if not data.get("prompt_token_ids") or not isinstance(choice.get("token_ids"), list):
        raise PreflightError(
            "the server ignores return_token_ids (no prompt_token_ids / choices[0].token_ids in its "
            "reply): it needs vLLM >= 0.10.2. Without the ids no trace can be kept; upgrade the server"
        )
    message = choice["message"] or {}
    reasoning = message.get("reasoning", message.get("reasoning_content"))
    if reasoning_parser and not sampling.thinking_off:
        if reasoning is None:
            content = str(message.get("content"))[:120]
            raise PreflightError(
                f"server.json names reasoning parser {reasoning_parser!r}, but the reply has no "
                f"reasoning (content began {content!r}): check the unit's --reasoning-parser and the "
                "chat template, or switch thinking off with generation.chat_template_kwargs"
            )
        found = "returned"
    else:
        found = "not expected" if not reasoning_parser else "thinking off"
    return {"token_ids": True, "reasoning": found}


def served_model(models: Any, name: str) -> dict[str, Any]:
    """The /v1/models entry of `name`; PreflightError naming what is served otherwise."""
    entries = models.get("data") if isinstance(models, dict) else None
    for entry in entries or []:
        if entry.get("id") == name:
            return entry
    served = [entry.get("id") for entry in entries or []]
    raise PreflightError(
        f"the server does not serve {name!r} (it serves {served}): rerun snapshot_server, or fix "
        "the unit's --served-model-name"
    )


async def _get_json(http: Http, method: str, path: str, body: bytes, timeout: float) -> tuple[int, Any]:
    response = await http.request(method, path, body, timeout)
    try:
        return response.status, json.loads(response.body or b"null")
    except ValueError:
        return response.status, response.body[:300].decode(errors="replace")


async def _count_tokens(
    http: Http, prompts: list[dict[str, Any]], sampling: Sampling, timeout: float
) -> list[int | None]:
    """Prompt tokens of each prompt, templated as sent (None where /tokenize did not answer)."""
    gate = asyncio.Semaphore(COUNT_CONCURRENCY)

    async def one(prompt: dict[str, Any]) -> int | None:
        body: dict[str, Any] = {
            "model": sampling.model,
            "messages": chat_messages(prompt),
            "add_generation_prompt": True,
        }
        if sampling.chat_template_kwargs:
            body["chat_template_kwargs"] = sampling.chat_template_kwargs
        async with gate:
            status, data = await _get_json(http, "POST", "/tokenize", json.dumps(body).encode(), timeout)
        return data.get("count") if status == 200 and isinstance(data, dict) else None

    return list(await asyncio.gather(*(one(p) for p in prompts)))


def longest_prompts(selection_path: str | Path, limit: int) -> tuple[int, list[dict[str, Any]]]:
    """(how many prompts the selection holds, the `limit` longest by characters)."""
    frame = pl.read_parquet(selection_path, columns=["id", "system", "question"])
    size = pl.col("question").str.len_chars() + pl.col("system").fill_null("").str.len_chars()
    return frame.height, frame.sort(size, descending=True).head(limit).to_dicts()


def fit_report(counts: list[int | None], total: int, max_tokens: int, max_model_len: int) -> dict:
    """How many prompts do not fit max_model_len with max_tokens.

    `counts` are the longest prompts' token counts, longest first by characters. The uncounted rest
    are shorter; when the shortest counted one fits, they are taken to fit too, else the number is
    a lower bound (`at_least`).
    """
    over = [count + max_tokens > max_model_len for count in counts if count is not None]
    return {
        "prompts": total,
        "counted": len(over),
        "over_max_model_len": sum(over),
        "at_least": len(over) < total and bool(over) and over[-1],
    }


async def _preflight(
    base_url: str,
    sampling: Sampling,
    snapshot: ServerSnapshot,
    http: Http,
    selection_path: str | Path,
    timeout: float,
) -> dict[str, Any]:
    status, models = await _get_json(http, "GET", "/v1/models", b"", timeout)
    if status != 200:
        raise PreflightError(f"{base_url}/v1/models answered HTTP {status}: {models}")
    entry = served_model(models, sampling.model)
    max_model_len = entry.get("max_model_len") or snapshot.max_model_len
    if max_model_len and sampling.max_tokens >= max_model_len:
        raise PreflightError(
            f"generation.max_tokens = {sampling.max_tokens} leaves no room for a prompt within the "
            f"server's max_model_len = {max_model_len}: lower generation.max_tokens or raise the "
            "unit's --max-model-len"
        )
    probe = replace(sampling, max_tokens=min(PROBE_MAX_TOKENS, sampling.max_tokens))
    status, data = await _get_json(http, "POST", "/v1/chat/completions", chat_body(PROBE, probe), timeout)
    if status != 200:
        raise PreflightError(
            f"a {probe.max_tokens}-token request to {base_url} answered HTTP {status}: {data}"
        )
    result = {
        "served_model_name": sampling.model,
        "max_model_len": max_model_len,
        "max_tokens": sampling.max_tokens,
        **check_probe_reply(data, snapshot.reasoning_parser, sampling),
    }
    total, longest = longest_prompts(selection_path, PREFLIGHT_COUNTED)
    counts = await _count_tokens(http, longest, sampling, timeout) if max_model_len else []
    result["fit"] = fit_report(counts, total, sampling.max_tokens, max_model_len or 0)
    return result


def run_preflight(
    base_url: str,
    sampling: Sampling,
    snapshot: ServerSnapshot,
    selection_path: str | Path,
    api_key: str | None = None,
    ca_bundle: str | None = None,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Check the server and the prompts' fit; return the findings (PreflightError when unusable)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def run() -> dict[str, Any]:
        http = Http(base_url, headers, COUNT_CONCURRENCY, ca_bundle)
        try:
            return await _preflight(base_url, sampling, snapshot, http, selection_path, timeout_s)
        finally:
            await http.close()

    result = asyncio.run(run())
    fit = result["fit"]
    if fit["prompts"] and not fit["counted"]:
        log.warning("could not count prompt tokens (no /tokenize, or no max_model_len): fit not checked")
    if fit["over_max_model_len"]:
        log.warning(
            "%s%d of %d prompts do not fit max_model_len %s with max_tokens %d: they will be skipped "
            "(%d counted with /tokenize, the longest by characters)",
            "at least " if fit["at_least"] else "",
            fit["over_max_model_len"],
            fit["prompts"],
            result["max_model_len"],
            result["max_tokens"],
            fit["counted"],
        )
    log.info("preflight passed: %s", json.dumps(result))
    return result


def preflight_generation(
    server_json_path: str,
    server: ServerSettings,
    generation: GenerationSettings,
    selection_path: str,
    output_path: str,
    state_dir: str,
) -> None:
    """The preflight_generation rule: start the server if needed, check it, write the findings.

    Only `generation`'s sampling is read; the rule records only that (payload.sampling_params), so
    changing the concurrency does not rerun the preflight.
    """
    _preflight_one(server_json_path, server, state_dir, output_path, generation, selection_path)


def preflight_replicas(
    replicas: list[tuple[Server, str]],
    generation: GenerationSettings,
    selection_path: str,
    summary_path: str,
) -> None:
    """The preflight_replicas rule: each of server.replicas checked as the primary is, all at once.

    Args:
        replicas: (replica, findings path) pairs; each server is started (when managed) in its own
            thread, since a managed 8-GPU server loads for many minutes and one after another would
            add those up.
        generation: as preflight_generation's.
        selection_path: the first selection block (the fit check's prompts).
        summary_path: the replicas checked, by name: what the shard jobs wait for (no timestamp, so a
            rerun that finds the same writes the same bytes).

    Raises:
        PreflightError: some replica failed; the message names every one that did.
    """
    from concurrent.futures import ThreadPoolExecutor

    problems = []
    if replicas:
        with ThreadPoolExecutor(len(replicas)) as pool:
            futures = [
                pool.submit(
                    _preflight_one, r.server_json, r.settings, r.state_dir, out, generation, selection_path
                )
                for r, out in replicas
            ]
        for (replica, _), future in zip(replicas, futures, strict=True):
            error = future.exception()
            if error is not None:
                log.error("preflight of replica %s failed: %s", replica.name, error)
                problems.append((replica.name, error))
    if problems:
        names = ", ".join(name for name, _ in problems)
        first = problems[0][1]
        raise PreflightError(f"the preflight failed for replica(s) {names}: {first}") from first
    io.write_json({"replicas": [r.name for r, _ in replicas]}, summary_path, indent=1)


def _preflight_one(
    server_json_path: str,
    server: ServerSettings,
    state_dir: str,
    output_path: str,
    generation: GenerationSettings,
    selection_path: str,
) -> None:
    from eagle3_pipeline.secrets import redact_data
    from eagle3_pipeline.server import api_key
    from eagle3_pipeline.server.lifecycle import ensure_running

    snapshot = ServerSnapshot.load(server_json_path)
    base_url = ensure_running(snapshot, server, Path(state_dir))
    sampling = Sampling.from_settings(generation, snapshot.request_model)
    result = run_preflight(
        base_url,
        sampling,
        snapshot,
        selection_path,
        api_key=api_key(server),
        ca_bundle=server.ca_bundle,
    )
    io.write_json(redact_data(result), output_path, indent=1, sort_keys=True)  # server text in it
