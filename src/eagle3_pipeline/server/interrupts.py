"""SIGTERM, SIGINT and SIGHUP as exceptions, so that `finally` blocks that restore production run.

SLURM cancels a job with SIGTERM (then SIGKILL after its KillWait, 30 s by default); Snakemake and a
user at the terminal send SIGINT; a closed terminal sends SIGHUP. By default SIGTERM and SIGHUP end
Python without running `finally` blocks. Inside `interrupts_as_exceptions()` all three raise
`Interrupted`, which unwinds like any exception; inside
`deferred_interrupts()` (a restore in progress) they are only recorded, so the restore finishes.
Signal handlers exist only in the main thread: elsewhere both are no-ops.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)
# SIGHUP: the terminal the check was started from closed (an SSH session to the login node dropped).
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Interrupted(BaseException):
    """SIGTERM, SIGINT or SIGHUP while the serve check held production: unwinds through the restore."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def interrupts_as_exceptions() -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP raise Interrupted inside the block (main thread only; elsewhere no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[list[int]]:
    """Signals that arrive inside the block are recorded, not acted on: a restore must finish
    (SLURM sends SIGKILL after its KillWait, 30 s by default, which nothing can defer)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum: int, frame: object) -> None:
        received.append(signum)
        log.warning("%s during the restore: finishing the restore first", signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
