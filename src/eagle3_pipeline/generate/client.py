"""One question to its outcome: retries, a shared wait on /health, what fails a prompt or the job.

Outcomes of one request, and why:
- `ok`: a 200 reply with choices.
- `skipped`: HTTP 400 about the context length (the prompt plus max_tokens does not fit).
- `failed`: a property of the request, which a rerun would meet again: another 4xx, a malformed 200
  reply (bad JSON, no `choices`) after the retries, an HTTP 500 after the retries while /health says
  the server is fine.
- ServerUnavailable (raised: the shard job fails, its journal kept, the rerun resumes): the server did
  not come back within `server.start_timeout_s`, or connection errors, 408/429/5xx or request
  timeouts outlasted the retries. An outage is not a property of a prompt.

A refused connection or a 503 means the server is restarting: every worker then waits on one shared
/health poller instead of spending its retries. A request timeout (`generation.request_timeout_s`) is
retried without suspecting the server (it answered slowly, it is not down). The body is built in
payload.py and the reply parsed in reply.py.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from eagle3_pipeline.generate.http import Http
from eagle3_pipeline.generate.payload import Sampling, chat_body
from eagle3_pipeline.generate.reply import MalformedReply, decode_reply, error_message, is_context_error
from eagle3_pipeline.secrets import REDACTOR

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class ServerUnavailable(RuntimeError):
    """The server could not answer: an outage or transient errors past the retries. The shard fails."""


REVIVE_AFTER_S = 30.0  # grace for a supervisor (systemd Restart=) before the pipeline starts it itself


class HealthGate:
    """A single /health poller that every worker waits on after a refused connection or a 503."""

    def __init__(self, http: Http, timeout_s: float, revive: Callable[[], object] | None = None) -> None:
        self.http, self.timeout_s = http, timeout_s
        # A managed server that died (not merely restarting under systemd's Restart=) is started
        # again by `revive` once it has been down for REVIVE_AFTER_S.
        self.revive = revive
        self._healthy = asyncio.Event()
        self._healthy.set()
        self._poller: asyncio.Task[None] | None = None
        self.dead: str | None = None

    def suspect(self, why: str) -> None:
        if self._healthy.is_set() and self.dead is None:
            log.warning("server unreachable (%s): waiting for %s/health", why, self.http.endpoint.origin)
            self._healthy.clear()
            self._poller = asyncio.create_task(self._poll())

    async def wait(self) -> None:
        await self._healthy.wait()

    async def healthy_now(self) -> bool:
        """One /health request: True on 200."""
        try:
            return (await self.http.request("GET", "/health", timeout=10)).status == 200
        except (OSError, TimeoutError, aiohttp.ClientError):
            return False

    async def _poll(self) -> None:
        start, revived = time.monotonic(), False
        while time.monotonic() - start < self.timeout_s:
            if await self.healthy_now():
                log.warning("server healthy again after %.1f s", time.monotonic() - start)
                break
            if self.revive and not revived and time.monotonic() - start > REVIVE_AFTER_S:
                revived = True
                log.warning("server still down after %.0f s: starting it again", REVIVE_AFTER_S)
                try:
                    await asyncio.to_thread(self.revive)
                except Exception as exc:  # noqa: BLE001 - reported as the reason the shard fails
                    self.dead = f"server died and could not be started again: {exc}"
                    log.error(self.dead)
                    break
            await asyncio.sleep(1.0)
        else:
            self.dead = f"server not healthy within server.start_timeout_s = {self.timeout_s:.0f} s"
            log.error(self.dead)
        self._healthy.set()


@dataclass
class _Try:
    """One attempt's verdict: a final outcome, or the kind of error to retry and its message."""

    outcome: dict[str, Any] | None = None
    kind: str = ""  # transient | timeout | malformed | server_500
    error: str = ""


class ChatClient:
    """Sends questions to one vLLM server; `complete` returns ok|skipped|failed or raises
    ServerUnavailable.

    Args:
        base_url: e.g. http://127.0.0.1:8000 or https://gateway/v1 (a trailing /v1 is accepted).
        sampling: model name and sampling parameters.
        api_key: sent as a bearer token when set.
        retries: attempts after the first, for each kind of retryable error.
        request_timeout_s: seconds for one attempt.
        health_timeout_s: how long a restarting server may take before the shard fails.
        revive: called (in a thread) when the server stays down: starts a managed server again.
        concurrency: connections the session may open.
        ca_bundle: PEM bundle trusted for https (None: the system's).
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
        concurrency: int = 64,
        ca_bundle: str | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = Http(base_url, headers, concurrency, ca_bundle)
        self.sampling, self.retries, self.timeout, self.backoff_s = (
            sampling,
            retries,
            request_timeout_s,
            backoff_s,
        )
        self.health = HealthGate(self.http, health_timeout_s, revive)

    async def close(self) -> None:
        await self.http.close()

    async def complete(
        self, prompt: dict[str, Any], history: list[dict[str, str]] | None = None
    ) -> dict[str, Any]:
        """One question to its final outcome: a dict with status ok|skipped|failed and reason.

        Raises:
            ServerUnavailable: the server stayed down, or transient errors outlasted the retries.
        """
        body = chat_body(prompt, self.sampling, history)
        tries: dict[str, int] = {}
        start = time.perf_counter()
        error = ""
        while True:
            await self.health.wait()
            if self.health.dead:
                raise ServerUnavailable(f"{self.health.dead}; last error: {error or 'none'}")
            verdict = await self._attempt(body, start)
            if verdict.outcome is not None:
                return verdict.outcome
            error = verdict.error
            tries[verdict.kind] = tries.get(verdict.kind, 0) + 1
            if tries[verdict.kind] > self.retries:
                return await self._give_up(verdict, tries[verdict.kind], start)
            await asyncio.sleep(self.backoff_s * 2 ** (tries[verdict.kind] - 1) * (0.5 + random.random()))

    async def _give_up(self, verdict: _Try, attempts: int, start: float) -> dict[str, Any]:
        """The outcome once one kind of error outlasted the retries (or ServerUnavailable)."""
        reason = f"{attempts} attempts, last error: {verdict.error}"
        if verdict.kind == "malformed":
            return outcome("failed", reason, start)
        if verdict.kind == "server_500" and await self.health.healthy_now():
            return outcome("failed", f"{reason} (while /health answers 200)", start)
        if verdict.kind == "timeout":
            reason += " (raise generation.request_timeout_s if the server is just slow)"
        raise ServerUnavailable(reason)

    async def _attempt(self, body: bytes, start: float) -> _Try:
        try:
            response = await self.http.request("POST", "/v1/chat/completions", body, self.timeout)
        except aiohttp.ClientSSLError as exc:  # a setup error: no retry or outage wait will mend it
            raise ServerUnavailable(
                f"TLS with {self.http.endpoint.origin} failed ({exc}); for a certificate from a private "
                "CA set server.ca_bundle to that CA's PEM file"
            ) from exc
        except aiohttp.ConnectionTimeoutError as exc:  # before TimeoutError: it is one
            self.health.suspect(f"no connection: {exc!r}")
            return _Try(kind="transient", error=f"no connection: {exc!r}")
        except TimeoutError:  # before OSError: on Python 3.11 TimeoutError is an OSError
            return _Try(kind="timeout", error=f"no response within {self.timeout:.0f} s")
        except aiohttp.ServerDisconnectedError as exc:
            # most often a keep-alive connection the server closed while idle: retry, no suspicion
            return _Try(kind="transient", error=repr(exc))
        except (OSError, aiohttp.ClientConnectionError) as exc:
            self.health.suspect(repr(exc))
            return _Try(kind="transient", error=repr(exc))
        except aiohttp.ClientError as exc:  # the response itself was broken (bad framing)
            return _Try(kind="malformed", error=repr(exc))
        if response.status == 200:
            try:
                return _Try(outcome("ok", None, start, decode_reply(response.body)))
            except MalformedReply as exc:
                log.warning("malformed reply, retrying: %s", exc)
                return _Try(kind="malformed", error=str(exc))
        message = error_message(response.body)
        if is_context_error(response.status, message):
            return _Try(outcome("skipped", f"HTTP 400: {message}", start))
        if response.status in RETRY_STATUS:
            if response.status == 503:
                self.health.suspect("HTTP 503")
            kind = "server_500" if response.status == 500 else "transient"
            return _Try(kind=kind, error=f"HTTP {response.status}: {message}")
        return _Try(outcome("failed", f"HTTP {response.status}: {message}", start))


def outcome(status: str, reason: str | None, start: float, fields: dict | None = None) -> dict[str, Any]:
    """A journaled result: status, reason, the reply's fields (None when there is no reply), latency."""
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
