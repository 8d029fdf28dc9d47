"""Count the suite's expensive setup: vLLM process starts (servers and extraction engines) and demo-target
fits, whoever starts them (a fixture, the pipeline's own code, or a Snakemake job the test runs).

A daemon thread polls /proc once a second for processes descended from this pytest process whose
command line names a vLLM server, a vLLM extraction worker or the demo-target builder; each one is
counted once (by pid and start time). vLLM takes many seconds to start and a fit minutes, so none is
missed. tests/conftest.py prints the counts at the end of the session.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

from eagle3_pipeline.server import process_identity

KINDS = {
    "vllm server": ("vllm.entrypoints.openai.api_server", "vllm serve"),
    "vllm extraction engine": ("eagle3_pipeline.hidden_states.vllm_worker",),
    "demo-target fit": ("build_demo_target",),  # the rule's script (Snakemake names it after the rule)
}

STAND_IN = "/standin-vllm-"  # support.systemd_box: the folder of the stand-in production server


def _command_line(pid: int) -> str | None:
    """The process's argv joined with spaces, to match the KINDS in (never logged: it may hold secrets)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, start time, command line) of every process readable in /proc."""
    table = {}
    for pid in process_identity.pids():
        fields, cmdline = process_identity.stat_fields(pid), _command_line(pid)
        if fields is not None and cmdline is not None:
            table[pid] = (int(fields[1]), int(fields[19]), cmdline)
    return table


class CostCounter(threading.Thread):
    """The vLLM starts and fits of this process's descendants; `fits_in_process` counts our own."""

    def __init__(self, interval_s: float = 1.0) -> None:
        super().__init__(daemon=True, name="cost-counter")
        self.interval_s, self.root = interval_s, os.getpid()
        self.seen: dict[tuple[int, int], str] = {}
        self.fits_in_process = 0
        self._done = threading.Event()

    def _descends(self, pid: int, table: dict[int, tuple[int, int, str]]) -> bool:
        while pid in table and pid > 1:
            pid = table[pid][0]
            if pid == self.root:
                return True
        return False

    def poll(self) -> None:
        table = _processes()
        for pid, (_, start, cmdline) in table.items():
            if STAND_IN in cmdline:  # the real-systemd tier's `vllm serve` is a stand-in, no vLLM
                continue
            kind = next((k for k, marks in KINDS.items() if any(m in cmdline for m in marks)), None)
            if kind and (pid, start) not in self.seen and self._descends(pid, table):
                parent = table.get(table[pid][0], (0, 0, ""))[2]
                if not any(m in parent for m in KINDS[kind]):  # a child of the same command: counted once
                    self.seen[pid, start] = kind

    def run(self) -> None:
        while not self._done.wait(self.interval_s):
            self.poll()

    def stop(self) -> Counter[str]:
        self._done.set()
        self.join(timeout=5)
        self.poll()
        counts = Counter(self.seen.values())
        counts["demo-target fit"] += self.fits_in_process
        return counts


COUNTER = CostCounter()
