"""HTTP for generation: one aiohttp session per shard job, http:// or https://, proxies from the env.

One `ClientSession` (a pool of keep-alive connections, at most `limit` open) serves every worker of a
job. https is verified against the system trust store, or against `server.ca_bundle` (a PEM file) for
a gateway with a private CA. A proxy comes from the usual environment variables (HTTPS_PROXY,
HTTP_PROXY, NO_PROXY), looked up once per session: aiohttp's own `trust_env` looks it up (and
~/.netrc) in a worker thread on every request, which cost 3-5x the client CPU per request here
(benchmarks/generation.py).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

CONNECT_TIMEOUT_S = 30.0  # a server that does not accept a connection in 30 s is down, not busy


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes


@dataclass(frozen=True)
class Endpoint:
    """The server's origin and path prefix, from a base URL such as https://gw.example/llm/v1."""

    origin: str  # scheme://host:port
    prefix: str  # the path before /v1, without a trailing slash

    @classmethod
    def parse(cls, base_url: str) -> Endpoint:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url {base_url!r}: expected http://HOST[:PORT] or https://HOST[:PORT]")
        path = parts.path.rstrip("/")
        if path.endswith("/v1"):
            path = path[: -len("/v1")]
        return cls(f"{parts.scheme}://{parts.netloc}", path)

    def url(self, path: str) -> URL:
        return URL(f"{self.origin}{self.prefix}{path}")


def ssl_context(ca_bundle: str | None) -> ssl.SSLContext | bool:
    """Verification for https: the system trust store (True) or a context trusting `ca_bundle`."""
    if ca_bundle is None:
        return True
    try:
        return ssl.create_default_context(cafile=ca_bundle)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"server.ca_bundle {ca_bundle!r}: not a readable PEM bundle ({error})") from error


class Http:
    """A session on one server: `request` returns status and body, or raises aiohttp/timeout errors.

    Args:
        base_url: the server's base URL (a trailing /v1 is accepted).
        headers: sent with every request (the bearer token).
        limit: most connections open at once (the job's concurrency).
        ca_bundle: PEM file of the CA that signed an https server's certificate (None: system store).
    """

    def __init__(
        self, base_url: str, headers: dict[str, str], limit: int, ca_bundle: str | None = None
    ) -> None:
        self.endpoint = Endpoint.parse(base_url)
        self._headers = {"Content-Type": "application/json", **headers}
        self._ssl = ssl_context(ca_bundle)
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None
        # parsed once: yarl's parsing and a ClientTimeout per request are measurable client CPU
        self._urls: dict[str, URL] = {}
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        try:
            self._proxy, self._proxy_auth = get_env_proxy_for_url(URL(self.endpoint.origin))
        except LookupError:  # no proxy set for this scheme, or NO_PROXY names the host
            self._proxy, self._proxy_auth = None, None

    def _open(self) -> aiohttp.ClientSession:
        # created inside the running event loop (aiohttp binds the session to it)
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._limit, ssl=self._ssl, keepalive_timeout=60)
            self._session = aiohttp.ClientSession(
                connector=connector, headers=self._headers, auto_decompress=False
            )
        return self._session

    async def request(self, method: str, path: str, body: bytes = b"", timeout: float = 600.0) -> Response:
        """Send one request and read the whole response.

        Raises:
            TimeoutError: no complete response within `timeout` s (aiohttp.ConnectionTimeoutError, a
                subclass, when no connection opened within CONNECT_TIMEOUT_S).
            aiohttp.ClientConnectionError: refused, reset or closed before a complete response.
            aiohttp.ClientError: any other protocol failure (a malformed response).
        """
        limits = self._timeouts.get(timeout)
        if limits is None:
            limits = aiohttp.ClientTimeout(total=timeout, connect=min(timeout, CONNECT_TIMEOUT_S))
            self._timeouts[timeout] = limits
        url = self._urls.get(path) or self._urls.setdefault(path, self.endpoint.url(path))
        session = self._open()
        async with session.request(
            method,
            url,
            data=body or None,
            timeout=limits,
            proxy=self._proxy,
            proxy_auth=self._proxy_auth,
        ) as response:
            return Response(response.status, await response.read())

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
