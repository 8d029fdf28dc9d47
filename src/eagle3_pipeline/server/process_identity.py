"""Who a pid is: its start time (clock ticks after boot, /proc/PID/stat field 22) and a hash of its
command line (/proc/PID/cmdline), so that a pid read from a file is signalled only when it is still the
process that wrote it. The kernel reuses a pid once its process is gone, so a stale pid file may name
anything; a pid with its start time names one process for good. See proc(5)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def pids() -> Iterator[int]:
    """Every pid in /proc (a process may be gone by the time it is read)."""
    return (int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit())


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after `(comm)`, which may hold spaces: index 0 is field 3 of proc(5)
    (the state), 1 the parent pid, 2 the process group, 19 the start time; None when there is no such
    process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks after boot; None when there is no such process."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields else None


def cmdline_sha256(pid: int) -> str | None:
    """sha256 of the process's NUL-separated argv (hashed: argv may hold secrets); None when unknown."""
    try:
        return hashlib.sha256(Path(f"/proc/{pid}/cmdline").read_bytes()).hexdigest()
    except OSError:
        return None


def boot_id() -> str | None:
    """This kernel's boot id (a new random one at every boot; the same in every container of a
    machine); None where /proc does not say."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def pid_namespace() -> str | None:
    """This process's PID namespace (`pid:[INODE]`): two containers with host networking share a
    hostname, not this; a pid means something only inside its namespace."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def identity(pid: int | None = None) -> dict[str, Any]:
    """{'host', 'boot_id', 'pid_ns', 'pid', 'start_ticks', 'cmdline_sha256'} of a process (this one by
    default): host, boot and PID namespace say where the pid can be looked up at all."""
    pid = os.getpid() if pid is None else pid
    return {
        "host": socket.gethostname(),
        "boot_id": boot_id(),
        "pid_ns": pid_namespace(),
        "pid": pid,
        "start_ticks": start_ticks(pid),
        "cmdline_sha256": cmdline_sha256(pid),
    }


def is_running(record: dict[str, Any]) -> bool | None:
    """True when the process a record names (`identity`) still runs, False when it is provably gone
    (its pid is free, or now another process's), None when this process cannot tell: another machine,
    another boot or another PID namespace (two containers sharing a hostname), or a record without
    them (an older version's). Only False allows a recovery."""
    here = (socket.gethostname(), boot_id(), pid_namespace())
    there = (record.get("host"), record.get("boot_id"), record.get("pid_ns"))
    if None in here or there != here:
        return None
    pid = record.get("pid")
    if not isinstance(pid, int) or record.get("start_ticks") is None:
        return None
    return start_ticks(pid) == record["start_ticks"]  # pid and start time name one process for good


def where_text(record: dict[str, Any]) -> str:
    """Why `is_running` cannot tell, in words, for an error message."""
    if record.get("host") != socket.gethostname():
        return f"ran on another machine ({record.get('host')})"
    if record.get("boot_id") is None or record.get("pid_ns") is None:
        return "was written by a version that did not record its boot and PID namespace"
    if record.get("boot_id") != boot_id():
        return "ran under another boot id (another machine with the same hostname, or before a reboot)"
    if record.get("pid_ns") != pid_namespace():
        return f"ran in another PID namespace ({record.get('pid_ns')}: another container with this hostname)"
    return "is still running"


def pid_alive(pid: int) -> bool:
    """The process runs (a zombie, or our own exited child, reaped here, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)  # reap it if it is our exited child
        if done == pid:
            return False
    fields = stat_fields(pid)
    return fields is None or fields[0] != "Z"


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on TCP `port` (any address), from /proc/net/tcp{,6}."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()  # sl local_address rem_address st ... inode (10th)
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(fields[9])
    return inodes


def group_listens_on(pgid: int, port: int) -> bool | None:
    """Whether a process of process group `pgid` holds the socket listening on `port`: a server that
    answers a port it was started on may be another program that took the port first. None where
    /proc cannot say (no /proc/net/tcp)."""
    if not Path("/proc/net/tcp").exists():
        return None
    inodes = _listening_inodes(port)
    for pid in pids():
        fields = stat_fields(pid)
        if fields is None or int(fields[2]) != pgid:
            continue
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return True
    return False
