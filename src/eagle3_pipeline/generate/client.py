"""One question as one chat request to vLLM: payload, retries, a shared wait on /health, parsing.

Retried with exponential backoff: connection errors, timeouts, HTTP 408, 429 and 5xx. A refused
connection or a 503 means the server is restarting: every worker then waits on one shared /health
poller instead of burning its retries. HTTP 400 about the context length is final: the question is
recorded as skipped with the server's message. Reasoning comes from `message.reasoning`, then
`reasoning_content`, else is split out of `<think>...</think>` in the content (a server without a
reasoning parser), including output that holds only `</think>` because the prompt opened the block.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eagle3_pipeline.generate.http import Connection, ConnectionLost, Endpoint
from eagle3_pipeline.server.secrets import REDACTOR

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
CONTEXT_HINTS = ("context length", "max_model_len", "maximum model length", "too long")


@dataclass(frozen=True)
class Sampling:
    """What shapes an answer besides the question; all of it goes into the journal's params hash."""

    model: str
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, generation: dict[str, Any], model: str) -> Sampling:
        return cls(
            model=model,
            max_tokens=generation["max_tokens"],
            temperature=generation["temperature"],
            top_p=generation["top_p"],
            seed=generation.get("seed"),
            chat_template_kwargs=dict(generation.get("chat_template_kwargs") or {}),
        )


def request_seed(base: int | None, prompt_id: str) -> int | None:
    """The per-request seed: derived from generation.seed and the id, so a retry samples the same."""
    if base is None:
        return None
    digest = hashlib.blake2b(f"{base}:{prompt_id}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


def chat_body(prompt: dict[str, Any], sampling: Sampling) -> bytes:
    """The JSON body of /v1/chat/completions for one question (system turn kept when present)."""
    messages = [{"role": "system", "content": prompt["system"]}] if prompt.get("system") else []
    messages.append({"role": "user", "content": prompt["question"]})
    body: dict[str, Any] = {
        "model": sampling.model,
        "messages": messages,
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "return_token_ids": True,
    }
    seed = request_seed(sampling.seed, prompt["id"])
    if seed is not None:
        body["seed"] = seed
    if sampling.chat_template_kwargs:
        body["chat_template_kwargs"] = sampling.chat_template_kwargs
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def split_thinking(text: str | None) -> tuple[str | None, str | None]:
    """(reasoning, content) from raw output of a server without a reasoning parser.

    `<think>R</think>C` and `R</think>C` (the prompt opened the block) give (R, C); `<think>R` (cut off
    by max_tokens) gives (R, ""); text without tags gives (None, text).
    """
    if text is None:
        return None, None
    close = text.find("</think>")
    if close >= 0:
        start = text.find("<think>", 0, close)
        reasoning = text[start + len("<think>") : close] if start >= 0 else text[:close]
        return reasoning, text[close + len("</think>") :]
    start = text.find("<think>")
    if start >= 0:
        return text[start + len("<think>") :], text[:start]
    return None, text


def parse_completion(data: dict[str, Any]) -> dict[str, Any]:
    """The stored fields of a 200 response: reasoning, content, finish_reason, token ids and counts."""
    choice = data["choices"][0]
    message = choice.get("message") or {}
    content = message.get("content")
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    if reasoning is None:
        reasoning, content = split_thinking(content)
    prompt_ids = data.get("prompt_token_ids")
    completion_ids = choice.get("token_ids")
    usage = data.get("usage") or {}
    return {
        "reasoning": reasoning,
        "content": content,
        "finish_reason": choice.get("finish_reason"),
        "prompt_token_ids": prompt_ids,
        "completion_token_ids": completion_ids,
        "prompt_tokens": len(prompt_ids) if prompt_ids is not None else usage.get("prompt_tokens"),
        "completion_tokens": (
            len(completion_ids) if completion_ids is not None else usage.get("completion_tokens")
        ),
    }


def error_message(body: bytes) -> str:
    try:
        error = json.loads(body).get("error")
        message = error.get("message") if isinstance(error, dict) else error
        return str(message if message is not None else body[:500].decode(errors="replace"))
    except (ValueError, AttributeError):
        return body[:500].decode(errors="replace")


def is_context_error(status: int, message: str) -> bool:
    return status == 400 and any(hint in message.lower() for hint in CONTEXT_HINTS)


REVIVE_AFTER_S = 30.0  # grace for a supervisor (systemd Restart=) before the pipeline starts it itself


class HealthGate:
    """A single /health poller that every worker waits on after a refused connection or a 503."""

    def __init__(
        self,
        endpoint: Endpoint,
        headers: dict[str, str],
        timeout_s: float,
        revive: Callable[[], object] | None = None,
    ) -> None:
        self.endpoint, self.headers, self.timeout_s = endpoint, headers, timeout_s
        # A managed server that died (not merely restarting under systemd's Restart=) is started
        # again by `revive` once it has been down for REVIVE_AFTER_S.
        self.revive = revive
        self._healthy = asyncio.Event()
        self._healthy.set()
        self._poller: asyncio.Task[None] | None = None
        self.dead: str | None = None

    def suspect(self, why: str) -> None:
        if self._healthy.is_set() and self.dead is None:
            log.warning("server unreachable (%s): waiting for %s/health", why, self.endpoint.host)
            self._healthy.clear()
            self._poller = asyncio.create_task(self._poll())

    async def wait(self) -> None:
        await self._healthy.wait()

    async def _poll(self) -> None:
        connection = Connection(self.endpoint, self.headers)
        start, revived = time.monotonic(), False
        while time.monotonic() - start < self.timeout_s:
            try:
                response = await connection.request("GET", "/health", timeout=10)
                if response.status == 200:
                    log.warning("server healthy again after %.1f s", time.monotonic() - start)
                    break
            except (OSError, TimeoutError):
                pass
            if self.revive and not revived and time.monotonic() - start > REVIVE_AFTER_S:
                revived = True
                log.warning("server still down after %.0f s: starting it again", REVIVE_AFTER_S)
                try:
                    await asyncio.to_thread(self.revive)
                except Exception as exc:  # noqa: BLE001 - reported as the reason requests fail
                    self.dead = f"server died and could not be started again: {exc}"
                    log.error(self.dead)
                    break
            await asyncio.sleep(1.0)
        else:
            self.dead = f"server not healthy within {self.timeout_s:.0f} s"
            log.error(self.dead)
        connection.close()
        self._healthy.set()


class ChatClient:
    """Sends questions to one vLLM server; `complete` never raises for a server-side problem.

    Args:
        base_url: e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted).
        sampling: model name and sampling parameters.
        api_key: sent as a bearer token when set.
        retries: attempts after the first, on retryable errors.
        request_timeout_s: seconds for one attempt.
        health_timeout_s: how long a restarting server may take before requests fail.
        revive: called (in a thread) when the server stays down: starts a managed server again.
    """

    def __init__(
        self,
        base_url: str,
        sampling: Sampling,
        api_key: str | None = None,
        retries: int = 5,
        request_timeout_s: float = 1800.0,
        health_timeout_s: float = 1800.0,
        backoff_s: float = 1.0,
        revive: Callable[[], object] | None = None,
    ) -> None:
        self.endpoint = Endpoint.parse(base_url)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.sampling, self.retries, self.timeout, self.backoff_s = (
            sampling,
            retries,
            request_timeout_s,
            backoff_s,
        )
        self.health = HealthGate(self.endpoint, self.headers, health_timeout_s, revive)

    def connection(self) -> Connection:
        return Connection(self.endpoint, self.headers)

    async def complete(self, connection: Connection, prompt: dict[str, Any]) -> dict[str, Any]:
        """One question to its final outcome: a dict with status ok|skipped|failed and reason."""
        body = chat_body(prompt, self.sampling)
        attempt, error = 0, ""
        start = time.perf_counter()
        while True:
            await self.health.wait()
            if self.health.dead:
                return _outcome("failed", f"{self.health.dead}; last error: {error}", start)
            outcome, error = await self._attempt(connection, body, start)
            if outcome is not None:
                return outcome
            attempt += 1
            if attempt > self.retries:
                return _outcome("failed", f"{attempt} attempts, last error: {error}", start)
            await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1) * (0.5 + random.random()))

    async def _attempt(self, connection: Connection, body: bytes, start: float) -> tuple[dict | None, str]:
        try:
            try:
                response = await connection.request("POST", "/v1/chat/completions", body, self.timeout)
            except ConnectionLost as exc:
                if not exc.reused:
                    raise
                # A keep-alive connection the server closed while idle: resend at once on a fresh one.
                response = await connection.request("POST", "/v1/chat/completions", body, self.timeout)
        except (OSError, ConnectionLost) as exc:
            self.health.suspect(repr(exc))
            return None, repr(exc)
        except TimeoutError:
            return None, f"no response within {self.timeout:.0f} s"
        if response.status == 200:
            result = parse_completion(json.loads(response.body))
            return _outcome("ok", None, start, result), ""
        message = error_message(response.body)
        if is_context_error(response.status, message):
            return _outcome("skipped", f"HTTP 400: {message}", start), ""
        if response.status in RETRY_STATUS:
            if response.status == 503:
                self.health.suspect("HTTP 503")
            return None, f"HTTP {response.status}: {message}"
        return _outcome("failed", f"HTTP {response.status}: {message}", start), ""


def _outcome(status: str, reason: str | None, start: float, fields: dict | None = None) -> dict[str, Any]:
    result = {
        "status": status,
        "reason": REDACTOR.scrub(reason) if reason else reason,  # server text, written to the shard
        "reasoning": None,
        "content": None,
        "finish_reason": None,
        "prompt_token_ids": None,
        "completion_token_ids": None,
        "prompt_tokens": None,
        "completion_tokens": None,
    }
    result.update(fields or {})
    result["latency_s"] = time.perf_counter() - start
    return result
