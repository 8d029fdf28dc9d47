"""Shared pytest setup: reusable fixtures live in tests/support/*.py and are registered here.

The directories are cost tiers: tests/unit (seconds; no vLLM, no fit, no snakemake run: `make
test-fast`), tests/integration (real vLLM CPU servers, a real sshd, the pipeline's stage code on the
demo target) and tests/workflow (Snakemake itself). A test marked `vllm`, `ssh` or `gpu` is skipped
here, with the reason from support.requirements, on a machine without that. The session ends with a
count of the vLLM starts and demo-target fits it cost (support.costs).
"""

import pytest
from support.costs import COUNTER
from support.requirements import CHECKS, missing

pytest_plugins = [
    "support.vllm_server",  # first: the other plugins import its launcher
    "support.draft",
    "support.generation_server",
    "support.hidden_states",
    "support.http_endpoint",
    "support.served_drafts",
    "support.sshd",
    "support.traces",
    "support.workflow",
]


def pytest_runtest_setup(item: pytest.Item) -> None:
    for need in CHECKS:
        if item.get_closest_marker(need) and (reason := missing(need)):
            pytest.skip(reason)


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # not in an xdist worker
        COUNTER.start()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not COUNTER.is_alive():
        return
    counts = COUNTER.stop()
    figures = ", ".join(f"{kind}: {counts[kind]}" for kind in ("vllm server", "vllm extraction engine"))
    terminalreporter.write_line(f"expensive setup: {figures}, demo-target fits: {counts['demo-target fit']}")
