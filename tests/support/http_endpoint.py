"""A scripted HTTP endpoint for the generation client's mechanics (retries, backoff, /health waits,
the global concurrency cap), which a real vLLM server cannot be made to exhibit on demand. It answers
in vLLM's response shape; what vLLM itself does is tested in tests/integration/test_generation.py.

Fixture `scripted_endpoint`: a started ScriptedEndpoint (thread with its own event loop) on a free port.
"""

from __future__ import annotations

import asyncio
import json
import socket
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
    """Answers /v1/chat/completions and /health; `failures` lists statuses to answer first (0: drop the
    connection), questions containing TOO LONG get vLLM's context-length 400."""

    def __init__(self, port: int | None = None) -> None:
        self.delay_s = 0.0
        self.failures: list[int] = []
        self.healthy = True
        self.reasoning_parser = True
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
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> ScriptedEndpoint:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket (the port refuses connections afterwards)."""

        def shutdown() -> None:
            self._server.close()  # closes the listening socket at once
            self._loop.stop()

        self._loop.call_soon_threadsafe(shutdown)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
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
            self._write(writer, 200 if self.healthy else 503, b"")
            return True
        request = json.loads(body)
        question = request["messages"][-1]["content"]
        with self.lock:
            self.requests[question] += 1
            self.bodies.append(request)
            status = self.failures.pop(0) if self.failures else 200
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            with self.lock:
                self.in_flight -= 1
        if status == 0:
            return False  # drop the connection without an answer
        if "TOO LONG" in question:
            message = "This model's maximum context length is 64 tokens. However, you requested 999 tokens."
            self._write(writer, 400, json.dumps({"error": {"message": message, "code": 400}}).encode())
        elif status != 200:
            self._write(writer, status, json.dumps({"error": {"message": f"scripted {status}"}}).encode())
        else:
            self._write(writer, 200, json.dumps(vllm_response(question, self.reasoning_parser)).encode())
        return True

    @staticmethod
    def _write(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
        head = f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)


@pytest.fixture
def scripted_endpoint():
    endpoint = ScriptedEndpoint().start()
    yield endpoint
    endpoint.stop()
