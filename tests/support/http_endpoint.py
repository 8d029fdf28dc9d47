"""A scripted HTTP endpoint for the generation client's mechanics (retries, backoff, /health waits,
timeouts, malformed replies, TLS, the global concurrency cap), which a real vLLM server cannot be made
to exhibit on demand. It answers in vLLM's response shape; what vLLM itself does is tested in
tests/integration/test_generation.py. With `token_ids = False` it behaves as a vLLM older than 0.10.2,
which ignores `return_token_ids` (the one fault the preflight must catch that no current vLLM shows).

Fixture `scripted_endpoint`: a started ScriptedEndpoint (thread with its own event loop) on a free port.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
from collections import Counter

import pytest


def vllm_response(question: str, reasoning_parser: bool = True) -> dict:
    """A /v1/chat/completions body shaped like vLLM 0.32's, deterministic in the question."""
    reasoning, content = f"thinking about {question}", f"answer to {question}"
    message = {"role": "assistant", "content": content, "reasoning": reasoning}
    if not reasoning_parser:
        message = {"role": "assistant", "content": f"{reasoning}</think>{content}"}
    ids = [len(question) % 50 + i for i in range(8)]
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "model": "demo",
        "prompt_token_ids": [1, 2, 3, len(question)],
        "choices": [{"index": 0, "message": message, "finish_reason": "stop", "token_ids": ids}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 8, "total_tokens": 12},
    }


class ScriptedEndpoint:
    """Answers /v1/chat/completions, /health, /v1/models and /tokenize; `failures` lists statuses to
    answer first (0: drop the connection), `delays` seconds to wait before the first answers,
    `malformed` 200 bodies to send first; questions containing TOO LONG get vLLM's context-length 400.
    With `tls` (an ssl.SSLContext) it serves https."""

    def __init__(self, port: int | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.delay_s = 0.0
        self.delays: list[float] = []
        self.failures: list[int] = []
        self.malformed: list[bytes] = []
        self.healthy = True
        self.health_checks = 0
        self.reasoning_parser = True
        self.token_ids = True
        self.model = "demo"
        self.max_model_len = 64
        self.requests: Counter[str] = Counter()
        self.bodies: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the old one's TIME_WAIT
        sock.bind(("127.0.0.1", port or 0))  # a given port: a "restarted" server on the same port
        self.port = sock.getsockname()[1]
        sock.close()
        self.base_url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> ScriptedEndpoint:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket (the port refuses connections afterwards)."""

        async def cancel_pending() -> None:  # handlers and handshakes still open, so none is left pending
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        def shutdown() -> None:
            self._server.close()  # closes the listening socket at once
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(cancel_pending(), self._loop).result(10)
        self._loop.call_soon_threadsafe(shutdown)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.set_exception_handler(_quiet_handshake_failures)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True, ssl=self.tls)
        )
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length) if length else b""
                path = head.split(b" ")[1].decode()
                if not await self._respond(path, body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def _respond(self, path: str, body: bytes, writer: asyncio.StreamWriter) -> bool:
        if path == "/health":
            self.health_checks += 1
            self._write(writer, 200 if self.healthy else 503, b"")
            return True
        if path == "/v1/models":
            data = [{"id": self.model, "object": "model", "max_model_len": self.max_model_len}]
            self._write(writer, 200, json.dumps({"object": "list", "data": data}).encode())
            return True
        request = json.loads(body)
        if path == "/tokenize":
            count = sum(len(m["content"].split()) + 4 for m in request["messages"])  # a word is a token
            reply = {"count": count, "max_model_len": self.max_model_len, "tokens": [1] * count}
            self._write(writer, 200, json.dumps(reply).encode())
            return True
        question = request["messages"][-1]["content"]
        with self.lock:
            self.requests[question] += 1
            self.bodies.append(request)
            status = self.failures.pop(0) if self.failures else 200
            delay = self.delays.pop(0) if self.delays else self.delay_s
            malformed = self.malformed.pop(0) if self.malformed and status == 200 else None
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(delay)
        finally:
            with self.lock:
                self.in_flight -= 1
        if status == 0:
            return False  # drop the connection without an answer
        if request["model"] != self.model:
            message = f"The model `{request['model']}` does not exist."
            self._write(writer, 404, json.dumps({"error": {"message": message, "code": 404}}).encode())
        elif malformed is not None:
            self._write(writer, 200, malformed)
        elif "TOO LONG" in question:
            message = "This model's maximum context length is 64 tokens. However, you requested 999 tokens."
            self._write(writer, 400, json.dumps({"error": {"message": message, "code": 400}}).encode())
        elif status != 200:
            self._write(writer, status, json.dumps({"error": {"message": f"scripted {status}"}}).encode())
        else:
            reply = vllm_response(question, self.reasoning_parser)
            if not self.token_ids:
                del reply["prompt_token_ids"], reply["choices"][0]["token_ids"]
            self._write(writer, 200, json.dumps(reply).encode())
        return True

    @staticmethod
    def _write(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
        head = f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)


def _quiet_handshake_failures(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """A client that does not trust the test certificate resets the TLS handshake: expected here."""
    if not isinstance(context.get("exception"), (ConnectionResetError, ssl.SSLError)):
        loop.default_exception_handler(context)


@pytest.fixture
def scripted_endpoint():
    endpoint = ScriptedEndpoint().start()
    yield endpoint
    endpoint.stop()
