"""Free TCP ports on this machine: for a tunnel's local end, a served check's vLLM, a test server."""

from __future__ import annotations

import random
import socket


class PortError(RuntimeError):
    """No port of the range asked for is free; the message names the range."""


def free_port(
    low: int | None = None, high: int | None = None, host: str = "127.0.0.1", shuffle: bool = False
) -> int:
    """A TCP port nobody is bound to on `host` right now (bind test).

    Args:
        low: With `high`, the first port of an inclusive range to search in order; when left out, any
            free port the kernel picks.
        high: The last port of the range.
        host: The address the port is for.
        shuffle: Search the range in random order: two callers starting at once rarely pick the same.

    Raises:
        PortError: every port of [low, high] is taken.
    """
    if low is None or high is None:
        with socket.socket() as sock:
            sock.bind((host, 0))
            return sock.getsockname()[1]
    ports = list(range(low, high + 1))
    if shuffle:
        random.shuffle(ports)
    for port in ports:
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise PortError(f"no free port in {low}-{high} on {host}; stop what listens there or widen the range")
