"""Shared pytest setup: reusable fixtures live in tests/support/*.py and are registered here.

The directories are cost tiers: tests/unit (seconds; no vLLM, no fit, no snakemake run: `make
test-fast`), tests/integration (real vLLM CPU servers, a real sshd, the pipeline's stage code on the
demo target) and tests/workflow (Snakemake itself). A test marked `vllm`, `ssh` or `gpu` is skipped
here, with the reason from support.requirements, on a machine without that. The session ends with a
count of the vLLM starts and demo-target fits it cost (support.costs).

`make test` runs the tiers on two pytest-xdist workers (`-n 2 --dist loadgroup`): a test module is one
unit of work, and the modules that share a session setup costing minutes (SHARED_SETUP) are one unit, so
that setup is built once, by one worker; the costliest units are handed out first.
"""

from pathlib import Path

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


# session fixtures that cost minutes -> the unit of work of every module that uses one
SHARED_SETUP = {
    "demo_e2e_workdir": "demo-e2e",  # the demo DAG, run once (support.workflow)
    "served_target": "served-draft",  # a draft trained, exported and served (support.served_drafts)
    "demo_vllm_server": "demo-server",  # the session's vLLM server (support.vllm_server)
}
# the units handed out first, costliest first; tests/unit second, so that the other worker runs it while
# the first fits the demo target
FIRST = ["demo-e2e", "unit-tier", "served-draft", "demo-server"]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent

    def rank(group: str) -> int:
        return FIRST.index(group) if group in FIRST else len(FIRST)

    groups: dict[Path, str] = {}  # module -> its unit of work
    for item in items:
        module = str(item.path.relative_to(tests))
        default = "unit-tier" if module.startswith("unit/") else module
        shared = [SHARED_SETUP[name] for name in SHARED_SETUP if name in item.fixturenames]
        groups[item.path] = min([groups.get(item.path, default), *shared], key=rank)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.path]))
    items.sort(key=lambda item: rank(groups[item.path]))  # stable: the files' order within a rank


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
