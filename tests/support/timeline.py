"""TEST_TIMELINE=path: every test phase's start, stop and worker appended to `path` (JSON lines), so
that a whole run's time can be laid out per worker and per unit of work (benchmarks/suite_timeline.py).

Written by the process that ran the phase (an xdist worker, or the only process without xdist), once.
"""

from __future__ import annotations

import json
import os

import pytest

_CONFIG: pytest.Config | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _CONFIG
    _CONFIG = config


def _runs_tests_here(config: pytest.Config) -> bool:
    """False on xdist's controller, which only relays its workers' reports."""
    distributed = getattr(config.option, "numprocesses", None) not in (None, 0)
    return hasattr(config, "workerinput") or not distributed


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get("TEST_TIMELINE")
    if not path or _CONFIG is None or not _runs_tests_here(_CONFIG):
        return
    record = {
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "nodeid": report.nodeid,
        "when": report.when,
        "start": report.start,
        "stop": report.stop,
        "outcome": report.outcome,
    }
    with open(path, "a") as out:  # one short line per write: appends from two workers stay whole
        out.write(json.dumps(record) + "\n")
