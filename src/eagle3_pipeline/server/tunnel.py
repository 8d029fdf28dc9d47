"""An SSH tunnel to the server port (`server.tunnel: true`) that survives a server still loading, a
server restart and a dropped SSH connection.

fabric's `forward_local` cannot: its listener thread dies for good on the first refused remote connect
(the port is not listening while vLLM loads), and its listening socket stays bound inside the dead
thread, so not even a new tunnel can take the port. This forwarder owns its listener for its whole
life and opens one `direct-tcpip` channel per accepted connection: a refused channel closes only that
local connection (the client sees the server as down, which it is), and a dead SSH transport is
reconnected (a rebuild) before the next channel opens. Health is polled through the tunnel, so
`health.wait_healthy` sees the server come up through it.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
from collections.abc import Mapping
from typing import Any

import paramiko

from eagle3_pipeline.ports import free_port
from eagle3_pipeline.server.health import check_health
from eagle3_pipeline.server.remote import HostError, RemoteHost
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.settings import ServerSettings, SshSettings

log = logging.getLogger(__name__)
_TUNNELS: dict[tuple[str, int], Tunnel] = {}
_CHUNK = 64 * 1024


def _pump(sock: socket.socket, channel: paramiko.Channel, stop: threading.Event) -> None:
    """Copy bytes both ways until either side closes (one thread per forwarded connection)."""
    try:
        while not stop.is_set():
            readable, _, _ = select.select([sock, channel], [], [], 1)
            if sock in readable:
                data = sock.recv(_CHUNK)
                if not data:
                    break
                channel.sendall(data)
            if channel in readable:
                data = channel.recv(_CHUNK)
                if not data:
                    break
                sock.sendall(data)
    except OSError:
        pass  # either side reset: this connection ends, the tunnel goes on
    finally:
        channel.close()
        sock.close()


class Tunnel:
    """127.0.0.1:local_port on this machine -> remote_host:remote_port as seen from the SSH host."""

    def __init__(
        self, destination: str, ssh: SshSettings, remote_port: int, remote_host: str = "127.0.0.1",
        local_port: int | None = None, ssh_config_path: str | None = None,
    ) -> None:  # fmt: skip
        self.destination, self.ssh, self.ssh_config_path = destination, ssh, ssh_config_path
        self.remote_port, self.remote_host = remote_port, remote_host
        self.local_port = local_port or free_port()
        self.host: RemoteHost | None = None
        self.rebuilds = 0  # SSH connections made after the first
        self.refused = 0  # connections the remote port refused (server down or loading)
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one (re)connect at a time

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    def _transport(self) -> paramiko.Transport:
        """The live SSH transport, reconnecting (strict host keys, timeouts) when it is gone."""
        with self._lock:
            transport = self.host.connection.transport if self.host else None
            if transport is not None and transport.is_active():
                return transport
            if self.host is not None:
                log.warning("SSH connection of the tunnel to %s is down; rebuilding it", self.destination)
                self.host.close()
                self.rebuilds += 1
            self.host = RemoteHost(self.destination, self.ssh, self.ssh_config_path)
            self.host.open()
            return self.host.connection.transport

    def open(self) -> None:
        """Connect and start listening on 127.0.0.1:local_port (accepting from the moment it returns)."""
        if self._listener is not None:
            return
        self._transport()
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.local_port))
        listener.listen(64)
        listener.settimeout(0.2)  # so that close() ends the accept loop promptly
        self._listener, self._stop = listener, threading.Event()
        threading.Thread(target=self._accept_loop, args=(listener, self._stop), daemon=True).start()
        log.info(
            "tunnel 127.0.0.1:%d -> %s:%s:%d", self.local_port, self.destination, self.remote_host,
            self.remote_port,
        )  # fmt: skip

    def _accept_loop(self, listener: socket.socket, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                sock, peer = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed
            sock.settimeout(None)
            channel = self._channel(peer)
            if channel is None:
                sock.close()  # the client sees a reset, as when the port itself refuses
                continue
            threading.Thread(target=_pump, args=(sock, channel, stop), daemon=True).start()

    def _channel(self, peer: tuple[str, int]) -> paramiko.Channel | None:
        """A direct-tcpip channel to the remote port; None when the remote refuses it or SSH fails."""
        for attempt in range(2):  # a transport found dead is rebuilt once per connection
            try:
                transport = self._transport()
                return transport.open_channel(
                    "direct-tcpip", (self.remote_host, self.remote_port), peer, timeout=10
                )
            except paramiko.ChannelException as err:  # connection refused on the remote side
                self.refused += 1
                log.debug("tunnel: %s:%d refused (%s)", self.remote_host, self.remote_port, err)
                return None
            except (HostError, paramiko.SSHException, OSError, EOFError) as err:
                log.warning("tunnel: SSH channel failed (%s), attempt %d", err, attempt + 1)
                if self.host is not None:
                    self.host.close()  # marks the transport dead: the next attempt reconnects
        return None

    def close(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._lock:
            if self.host is not None:
                with contextlib.suppress(Exception):
                    self.host.close()
                self.host = None

    def alive(self, headers: dict[str, str] | None = None, verify: bool | str = True) -> bool:
        """The SSH transport is up and /health answers through the tunnel (`verify`: server.ca_bundle)."""
        transport = self.host.connection.transport if self.host else None
        up = transport is not None and transport.is_active()
        return up and check_health(self.base_url, headers, verify=verify)

    def url(self) -> str:
        """The local URL; the listener is opened on first use and the SSH transport reconnected when
        it is down (health is the caller's business)."""
        if self._listener is None:
            self.open()
        else:
            self._transport()
        return self.base_url


def get_tunnel(snapshot: ServerSnapshot | Mapping[str, Any], server: ServerSettings) -> Tunnel:
    """The process-wide tunnel for this server (one per destination and port)."""
    snapshot = ServerSnapshot.of(snapshot)
    bind = snapshot.host
    remote_host = "127.0.0.1" if bind in (None, "", "0.0.0.0", "::") else bind
    key = (server.host, int(snapshot.port))
    if key not in _TUNNELS:
        _TUNNELS[key] = Tunnel(server.host, server.ssh, int(snapshot.port), remote_host)
    return _TUNNELS[key]
