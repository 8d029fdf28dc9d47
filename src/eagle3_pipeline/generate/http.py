"""A lean asyncio HTTP/1.1 client: one keep-alive connection per worker, no third-party dependency.

The client shares the CPU with the server on small machines, so it does the least per request: one
write of a prebuilt header plus body, a header read, and a body read by Content-Length (chunked
bodies are supported too). Measured in benchmarks/generation.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit


class ConnectionLost(ConnectionError):
    """The connection closed or broke before a complete response; `reused` says whether it had served
    a request before (then the server most likely closed it while idle)."""

    def __init__(self, message: str, reused: bool) -> None:
        super().__init__(message)
        self.reused = reused


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes


@dataclass(frozen=True)
class Endpoint:
    """host, port and path prefix of a base URL such as http://127.0.0.1:8000/v1 or http://h:8000."""

    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, base_url: str) -> Endpoint:
        parts = urlsplit(base_url)
        if parts.scheme != "http":
            raise ValueError(f"base_url {base_url!r}: only http:// is supported (use an SSH tunnel)")
        path = parts.path.rstrip("/")
        if path.endswith("/v1"):
            path = path[: -len("/v1")]
        return cls(parts.hostname or "127.0.0.1", parts.port or 80, path)


class Connection:
    """One persistent HTTP/1.1 connection, reopened on demand; not safe for concurrent requests."""

    def __init__(self, endpoint: Endpoint, headers: dict[str, str] | None = None) -> None:
        self.endpoint = endpoint
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = f"Host: {endpoint.host}:{endpoint.port}\r\n{extra}".encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._used = False

    async def request(self, method: str, path: str, body: bytes = b"", timeout: float = 600.0) -> Response:
        """Send one request and read the whole response.

        Raises:
            ConnectionLost: the connection broke; `reused` is True when it had served a request before
                (a keep-alive connection the server closed while idle: safe to retry at once).
            OSError: the connection could not be opened (server down or restarting).
            TimeoutError: no connection within min(timeout, 30) s, or no complete response within
                `timeout` seconds.
        """
        if self._writer is None:
            async with asyncio.timeout(min(timeout, 30.0)):
                self._reader, self._writer = await asyncio.open_connection(
                    self.endpoint.host, self.endpoint.port
                )
            self._used = False
        reused = self._used
        head = (
            f"{method} {self.endpoint.prefix}{path} HTTP/1.1\r\n".encode()
            + self._head
            + b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
        )
        try:
            async with asyncio.timeout(timeout):
                self._writer.write(head + body)
                response, keep = await self._read_response()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            self.close()
            raise ConnectionLost(f"connection lost: {exc!r}", reused) from exc
        except BaseException:
            self.close()
            raise
        self._used = True
        if not keep:
            self.close()
        return response

    async def _read_response(self) -> tuple[Response, bool]:
        reader = self._reader
        assert reader is not None
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, chunked, keep = None, False, True
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            elif name == "connection" and value.strip().lower() == "close":
                keep = False
        if chunked:
            body = await self._read_chunked(reader)
        elif length is not None:
            body = await reader.readexactly(length)
        else:
            body, keep = await reader.read(), False
        return Response(status, body), keep

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
