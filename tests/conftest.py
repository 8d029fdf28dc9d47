"""Shared pytest setup: reusable fixtures live in tests/support/*.py and are registered here.

The directories are cost tiers: tests/unit (seconds; no vLLM, no fit, no snakemake run: `make
test-fast`), tests/integration (real vLLM CPU servers, a real sshd, the pipeline's stage code on the
demo target) and tests/workflow (Snakemake itself). A test marked `vllm`, `ssh` or `gpu` is skipped
here, with the reason from support.requirements, on a machine without that. The session ends with a
count of the vLLM starts and demo-target fits it cost (support.costs).

`make test` runs the tiers on two pytest-xdist workers (`-n 2 --dist loadscope`, with the scheduler
below): a test module is one unit of work, and the modules that share a session setup costing minutes
(SHARED_SETUP) are one unit, so that setup is built once, by one worker; the costliest units are handed
out first.
"""

import pytest
from support.costs import COUNTER
from support.requirements import CHECKS, FIXTURE_NEEDS, missing, unavailable

pytest_plugins = [
    "support.vllm_server",  # first: the other plugins import its launcher
    "support.draft",
    "support.generation_server",
    "support.hidden_states",
    "support.http_endpoint",
    "support.served_drafts",
    "support.sshd",
    "support.systemd_box",
    "support.slurm",
    "support.traces",
    "support.workflow",
    "support.timeline",  # TEST_TIMELINE=path: each phase's start and stop, per worker
]


# session fixtures that cost minutes -> the unit of work of the modules that use one
SHARED_SETUP = {
    "demo_e2e_workdir": "demo-e2e",  # the demo DAG, run once (support.workflow)
    "served_target": "served-draft",  # a draft trained, exported and served (support.served_drafts)
    "demo_vllm_server": "demo-server",  # the session's vLLM server (support.vllm_server)
}
# ... written out by module: xdist's controller schedules by node id alone (collection checks the list)
SHARED_MODULES = {
    "tests/workflow/test_demo_e2e.py": "demo-e2e",
    "tests/workflow/test_disk_cap.py": "demo-e2e",
    "tests/workflow/test_incremental.py": "demo-e2e",
    "tests/integration/test_serve_check.py": "served-draft",
    "tests/integration/test_speculators_serve.py": "served-draft",
    "tests/integration/test_demo_target.py": "demo-server",
}
# handed out first, the costliest first; tests/unit second (the other worker's first minute and a half);
# then the workflow tier (its modules take a minute or two). The modules
# that mostly wait (SSH round trips, a stand-in unit's restarts: under half a core) go between the
# CPU-bound ones, so that the other worker's work fills the cores meanwhile; last, they left the
# cores half idle for the run's last 3 minutes.
FIRST = [
    "demo-e2e",
    "tests/unit/",
    "tests/integration/test_slurm_extraction.py",  # three engine starts and much waiting on squeue
    "served-draft",
    "tests/integration/test_serve_check_real_systemd.py",
    "demo-server",
    "tests/workflow/",
    "tests/integration/test_serve_check_real_systemd_254.py",
    "tests/integration/test_serve_check_host_record_ssh.py",
]


def unit_of_work(nodeid: str) -> str:
    """The scope a test is scheduled with: its shared setup's group, or its module."""
    module = nodeid.split("::", 1)[0]
    return SHARED_MODULES.get(module, module)


def _rank(nodeid: str) -> int:
    unit = unit_of_work(nodeid)
    return next((i for i, first in enumerate(FIRST) if unit.startswith(first)), len(FIRST))


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """--dist loadscope with SHARED_MODULES merged into one scope each, in collection order."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedSetupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

    config.option.loadscopereorder = False  # keep the order below, costliest first
    return SharedSetupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, group in SHARED_SETUP.items():
            module = item.nodeid.split("::", 1)[0]
            if fixture in item.fixturenames and SHARED_MODULES.get(module) != group:
                raise pytest.UsageError(
                    f"{module} uses the session fixture {fixture}: add it to SHARED_MODULES in "
                    f"tests/conftest.py as {group!r}, so that one xdist worker builds it once"
                )
        for fixture, need in FIXTURE_NEEDS.items():
            if fixture in item.fixturenames and not item.get_closest_marker(need):
                raise pytest.UsageError(
                    f"{item.nodeid} takes {fixture}, which starts a service: mark it "
                    f"@pytest.mark.{need} (support.requirements.FIXTURE_NEEDS)"
                )
    items.sort(key=lambda item: _rank(item.nodeid))  # stable: the files' order within a rank


def pytest_runtest_setup(item: pytest.Item) -> None:
    for need in CHECKS:
        if item.get_closest_marker(need) and (reason := missing(need)):
            unavailable(need, reason)  # a skip here, a failure under CI=true


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # not in an xdist worker
        COUNTER.start()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not COUNTER.is_alive():
        return
    counts = COUNTER.stop()
    figures = ", ".join(f"{kind}: {counts[kind]}" for kind in ("vllm server", "vllm extraction engine"))
    terminalreporter.write_line(f"expensive setup: {figures}, demo-target fits: {counts['demo-target fit']}")
