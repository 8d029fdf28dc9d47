"""A cap on requests in flight across every shard job on this machine: fcntl-locked slot files.

The slot directory holds `global_concurrency` files; a request may be in flight only while its worker
holds an exclusive `flock` on one of them. Each shard job runs one worker per slot it holds, so the
cap costs no system call per request. The kernel drops a dead process's locks, so a killed job never
leaks slots. A job polls for free slots while it has pending work and releases a slot as soon as its
worker finds no more work, so that the next job picks it up and the server stays saturated. Fairness:
a job holding more than its share (cap / jobs wanting slots) gives one slot back after each request.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path


class SlotPool:
    """Non-blocking acquisition of slot files `slot-0000.lock` .. under `directory`.

    Args:
        directory: shared by every job that must respect the same cap: results/{run}/work/generations/
            slots beside the shards' journals (generate/shard.py), a replica's under replica-slots/NAME.
        total: the global cap (generation.global_concurrency).
    """

    def __init__(self, directory: str | os.PathLike[str], total: int) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.total = total
        self._held: dict[int, int] = {}  # slot index -> fd
        # every slot file stays open: a poll for a free slot is then one flock call per slot, cheap
        # enough to poll every few milliseconds while a job waits (a freed slot is taken up at once)
        self._fds: dict[int, int] = {}
        self._want = self.directory / f"want-{os.getpid()}"

    @property
    def held(self) -> int:
        return len(self._held)

    def _fd(self, index: int) -> int:
        fd = self._fds.get(index)
        if fd is None:
            path = self.directory / f"slot-{index:04d}.lock"
            fd = self._fds[index] = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        return fd

    def try_acquire(self) -> int | None:
        """Lock one free slot and return its index, or None when all `total` are taken."""
        for index in range(self.total):
            if index in self._held:
                continue
            fd = self._fd(index)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            self._held[index] = fd
            return index
        return None

    def release(self, index: int) -> None:
        fcntl.flock(self._held.pop(index), fcntl.LOCK_UN)

    def set_wanting(self, wanting: bool) -> None:
        """Advertise (with a lock held on a want-PID file) that this job waits for slots."""
        if wanting and not hasattr(self, "_want_fd"):
            self._want_fd = os.open(self._want, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._want_fd, fcntl.LOCK_EX)
        elif not wanting and hasattr(self, "_want_fd"):
            fcntl.flock(self._want_fd, fcntl.LOCK_UN)
            os.close(self._want_fd)
            del self._want_fd
            with contextlib.suppress(FileNotFoundError):
                self._want.unlink()

    def others_wanting(self) -> int:
        """Other live jobs waiting for slots (a want file whose lock is held by a live process)."""
        count = 0
        for path in self.directory.glob("want-*"):
            if path == self._want:
                continue
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                count += 1  # locked: its owner is alive and waiting
            else:
                fcntl.flock(fd, fcntl.LOCK_UN)
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # stale: its owner died
            finally:
                os.close(fd)
        return count

    def close(self) -> None:
        for index in list(self._held):
            self.release(index)
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self.set_wanting(False)
