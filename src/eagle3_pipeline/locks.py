"""A place among N, held across processes: an exclusive flock on one of N lock files in a shared folder.

The kernel drops a process's locks when it exits, however it exits, so a killed holder never keeps its
place. Used by the extraction engine's client slots (hidden_states/engine.py) and the pack slots
(hidden_states/packing.py); generation's request cap is a pool of its own (generate/slots.py).
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class SlotLockError(OSError):
    """flock failed for another reason than a place being held (a filesystem without flock)."""


@contextmanager
def held_slot(folder: Path, slots: int, poll_s: float) -> Iterator[int]:
    """One of `slots` places in `folder`, held while the block runs; while every one is held, try again
    every `poll_s` seconds.

    Raises:
        SlotLockError: flock failed for another reason than a place being held (a filesystem without
            flock, such as Lustre mounted without -o flock); the caller names the setting behind
            `folder`. Errors of the block itself pass through as they are.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        for slot in range(max(int(slots), 1)):
            handle = open(folder / f"slot-{slot}", "a")  # noqa: SIM115 - held until the block ends
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # held by another process
                handle.close()
                continue
            except OSError as err:
                handle.close()
                raise SlotLockError(err.errno, f"{folder}: {err.strerror}") from err
            try:
                yield slot
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
            return
        time.sleep(poll_s)
