"""Free TCP ports on this machine: for a tunnel's local end, a served check's vLLM, a test server."""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Iterator


class PortError(RuntimeError):
    """No port of the range asked for is free; the message names the range."""


def free_port(low: int | None = None, high: int | None = None, host: str = "127.0.0.1") -> int:
    """A TCP port nobody is bound to on `host` right now (bind test).

    Args:
        low: With `high`, the first port of an inclusive range to search in order; when left out, any
            free port the kernel picks.
        high: The last port of the range.
        host: The address the port is for.

    Raises:
        PortError: every port of [low, high] is taken.
    """
    if low is None or high is None:
        with socket.socket() as sock:
            sock.bind((host, 0))
            return sock.getsockname()[1]
    sock, port = _bind_first(list(range(low, high + 1)), host, (low, high))
    sock.close()
    return port


@contextlib.contextmanager
def reserved_port(low: int, high: int, host: str = "127.0.0.1") -> Iterator[int]:
    """A free port of [low, high] (random order) held for the caller until the block ends: bound here
    exclusively, then marked SO_REUSEADDR, so that a server binding it with SO_REUSEADDR (vLLM, uvicorn)
    can listen on it while every other `free_port` or `reserved_port` finds it taken. Without this,
    two checks starting together can pick the same port in the tens of seconds before vLLM binds it.

    Raises:
        PortError: every port of [low, high] is taken.
    """
    ports = list(range(low, high + 1))
    random.shuffle(ports)
    sock, port = _bind_first(ports, host, (low, high))
    # set after the bind: the kernel checks the flag of the socket already bound when a server binds
    # with SO_REUSEADDR, and a bound socket that does not listen takes no connection
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    with sock:
        yield port


def _bind_first(ports: list[int], host: str, span: tuple[int, int]) -> tuple[socket.socket, int]:
    """The first of `ports` nobody holds on `host`, bound (no SO_REUSEADDR: the bind fails on a port any
    socket holds, listening or reserved)."""
    for port in ports:
        sock = socket.socket()
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            continue
        return sock, port
    low, high = span
    raise PortError(f"no free port in {low}-{high} on {host}; stop what listens there or widen the range")
