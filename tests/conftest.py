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
# then the workflow tier (its modules take a minute or two)
FIRST = [
    "demo-e2e",
    "tests/unit/",
    "served-draft",
    "demo-server",
    "tests/workflow/",
]
# The modules that mostly wait (SSH round trips, a real systemd's stops and starts, squeue): a tenth of
# a core or less. On workers of their own (`--waiting-workers 2`, as `make test` runs) they wait beside
# the CPU-bound units instead of holding one of the two CPU workers for 13 minutes. Longest first; a
# module with a test marked ssh, systemd or slurm must be listed (checked at collection).
WAITING = [
    "tests/integration/test_serve_check_real_systemd.py",  # 25 tests, ~6 min: stand-in stops, leases
    "tests/integration/test_slurm_extraction.py",  # three engine scopes, ~5 min: sbatch, squeue
    "tests/integration/test_serve_check_real_systemd_254.py",
    "tests/integration/test_server_ssh.py",
    "tests/integration/test_serve_check_host_record_ssh.py",
    "tests/integration/test_server_lifecycle_ssh.py",
    "tests/integration/test_serve_check_remote_ssh.py",
    "tests/integration/test_server_units_ssh.py",
    "tests/integration/test_server_secrets_ssh.py",
]
WAITING_MARKERS = ("ssh", "systemd", "slurm")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--waiting-workers",
        type=int,
        default=0,
        help="of the -n xdist workers, how many take the WAITING modules alone (0: any worker takes any)",
    )


def unit_of_work(nodeid: str) -> str:
    """The scope a test is scheduled with: its shared setup's group, or its module."""
    module = nodeid.split("::", 1)[0]
    return SHARED_MODULES.get(module, module)


def _rank(nodeid: str) -> int:
    unit = unit_of_work(nodeid)
    if unit in WAITING:
        return WAITING.index(unit) - len(WAITING)  # ahead of the rest: their workers start at once
    return next((i for i, first in enumerate(FIRST) if unit.startswith(first)), len(FIRST))


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """--dist loadscope with SHARED_MODULES merged into one scope each, in collection order, and the
    last --waiting-workers workers given the WAITING modules alone."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    waiting_workers = config.getoption("waiting_workers")

    class SharedSetupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

        def _waits(self, node) -> bool:
            return int(node.gateway.id.removeprefix("gw")) >= self.numnodes - waiting_workers

        def _assign_work_unit(self, node) -> None:
            if not 0 < waiting_workers < self.numnodes:
                return super()._assign_work_unit(node)
            waits = self._waits(node)
            # a waiting worker takes waiting units alone; the others take theirs first, then help
            scope = next((s for s in self.workqueue if (s in WAITING) == waits), None)
            if scope is None and not waits:
                scope = next(iter(self.workqueue))
            if scope is None:  # none of its kind left: an idle worker never shut down holds the session
                if not self._pending_of(self.assigned_work.get(node, {})):
                    node.shutdown()
                return
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    config.option.loadscopereorder = False  # keep the order below, costliest first
    return SharedSetupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        for fixture, group in SHARED_SETUP.items():
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
        if any(item.get_closest_marker(m) for m in WAITING_MARKERS) and module not in WAITING:
            raise pytest.UsageError(
                f"{module} waits on an ssh, systemd or slurm service: list it in WAITING (tests/conftest.py)"
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
