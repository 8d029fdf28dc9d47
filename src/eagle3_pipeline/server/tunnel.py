"""An SSH tunnel to the server port (`server.tunnel: true`), health-checked and rebuilt when it dies.

fabric's `forward_local` listens in a thread on an explicit local port; one refused remote connect kills
that thread for good. `Tunnel.url()` therefore checks the tunnel (TCP accept, then /health) on each call
and rebuilds it on the same local port when it does not answer.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from pathlib import Path
from typing import Any

from eagle3_pipeline.server.lifecycle import check_health
from eagle3_pipeline.server.remote import RemoteHost

log = logging.getLogger(__name__)
_TUNNELS: dict[tuple[str, int], Tunnel] = {}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Tunnel:
    """127.0.0.1:local_port on this machine -> remote_host:remote_port as seen from the SSH host."""

    def __init__(
        self, destination: str, ssh_cfg: dict[str, Any], remote_port: int, remote_host: str = "127.0.0.1",
        local_port: int | None = None, ssh_config_path: str | None = None,
    ) -> None:  # fmt: skip
        self.destination, self.ssh_cfg, self.ssh_config_path = destination, ssh_cfg, ssh_config_path
        self.remote_port, self.remote_host = remote_port, remote_host
        self.local_port = local_port or free_port()
        self.host: RemoteHost | None = None
        self._forward: contextlib.AbstractContextManager | None = None
        self.rebuilds = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    def open(self) -> None:
        """Connect (strict host keys, timeouts) and start forwarding; waits until the listener accepts."""
        self.host = RemoteHost(self.destination, self.ssh_cfg, self.ssh_config_path)
        self.host.open()
        self._forward = self.host.connection.forward_local(
            self.local_port, remote_port=self.remote_port, remote_host=self.remote_host
        )
        self._forward.__enter__()
        deadline = time.monotonic() + 5
        while not self._accepts() and time.monotonic() < deadline:
            time.sleep(0.05)  # the listener starts in a thread: the first connect can be refused
        log.info(
            "tunnel 127.0.0.1:%d -> %s:%s:%d",
            self.local_port,
            self.destination,
            self.remote_host,
            self.remote_port,
        )

    def _accepts(self) -> bool:
        with socket.socket() as sock:
            sock.settimeout(1)
            return sock.connect_ex(("127.0.0.1", self.local_port)) == 0

    def close(self) -> None:
        if self._forward is not None:
            with contextlib.suppress(Exception):  # a dead tunnel thread re-raises its error here
                self._forward.__exit__(None, None, None)
            self._forward = None
        if self.host is not None:
            self.host.close()
            self.host = None

    def alive(self, headers: dict[str, str] | None = None) -> bool:
        """The SSH transport is up, the listener accepts and /health answers through it."""
        transport = self.host.connection.transport if self.host else None
        up = transport is not None and transport.is_active()
        return up and self._accepts() and check_health(self.base_url, headers)

    def url(self, headers: dict[str, str] | None = None) -> str:
        """The local URL, rebuilding the tunnel first when it does not answer."""
        if self._forward is None:
            self.open()
        elif not self.alive(headers):
            log.warning("tunnel to %s:%d does not answer; rebuilding it", self.destination, self.remote_port)
            self.close()
            self.open()
            self.rebuilds += 1
        return self.base_url


def get_tunnel(server_json: dict[str, Any], server_cfg: dict[str, Any], state_dir: Path) -> Tunnel:
    """The process-wide tunnel for this server (one per destination and port)."""
    bind = server_json.get("host")
    remote_host = "127.0.0.1" if bind in (None, "", "0.0.0.0", "::") else bind
    key = (server_cfg["host"], int(server_json["port"]))
    if key not in _TUNNELS:
        _TUNNELS[key] = Tunnel(
            server_cfg["host"], server_cfg.get("ssh", {}), int(server_json["port"]), remote_host
        )
    return _TUNNELS[key]
