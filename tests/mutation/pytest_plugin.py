"""pytest plugin for mutation runs (tests/mutation/run.py loads it with `-p mutation_plugin`).

mutmut runs many pytest sessions in one process lineage: the stats run, a fork server that collects the
tests once, then one forked session per mutant. tests/conftest.py starts its cost counter (a thread,
support.costs.COUNTER) at every session start, and a thread starts once: a second session, or one forked
from a process that already started it, would fail on `RuntimeError: threads can only be started once`.
A mutation run starts no vLLM and fits nothing, so each session gets an idle counter instead (no thread
polling /proc once a second either); the suite itself (`make test`) never loads this plugin.
"""

from __future__ import annotations

import threading

import pytest


class IdleCounter:
    """Stands in for support.costs.COUNTER: started, never alive (tests/conftest.py then prints nothing)."""

    def start(self) -> None:
        pass

    def is_alive(self) -> bool:
        return False


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    for plugin in session.config.pluginmanager.get_plugins():
        if isinstance(getattr(plugin, "COUNTER", None), threading.Thread):  # tests/conftest.py's
            plugin.COUNTER = IdleCounter()
