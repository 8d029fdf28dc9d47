"""The Snakefile's fix of Snakemake 9's group checks (eagle3_pipeline.snakemake_groups_fix): each group is
checked once, not once per member, and not at all when no path leaves it and comes back (one walk tells),
with the same verdict and error on a group that depends on itself."""

from __future__ import annotations

import inspect
from collections import Counter
from types import SimpleNamespace

import pytest
import snakemake.api  # noqa: F401 - before snakemake.dag (its import cycle)
from snakemake.dag import DAG

from eagle3_pipeline import snakemake_groups_fix


class Job:
    """A DAG job as the group check reads it: hashable, with its rule's name."""

    def __init__(self, name: str) -> None:
        self.rule = SimpleNamespace(name=name, lineno=1, snakefile="Snakefile")
        self.group = "g"


class Group(frozenset):
    """A group job as the checks read it: its jobs, and its id for the error."""

    groupid = "g"

    @property
    def jobs(self) -> frozenset:
        return frozenset(self)


class CountingDependencies(dict):
    """A DAG's `_dependencies` that counts the walk's visits."""

    def __init__(self, *args):
        super().__init__(*args)
        self.visits: Counter = Counter()

    def __getitem__(self, job):
        self.visits[job] += 1
        return super().__getitem__(job)


def _fake_dag(jobs: list[Job], dependencies: dict[Job, list[Job]], grouped: list[Job]) -> SimpleNamespace:
    group = Group(grouped)
    # Snakemake's _dependencies: job -> {dependency: the files it gives}
    as_dicts = {job: dict.fromkeys(deps, set()) for job, deps in dependencies.items()}
    dag = SimpleNamespace(_group=dict.fromkeys(grouped, group), _dependencies=CountingDependencies(as_dicts))
    dag.bfs = lambda *args, **kwargs: DAG.bfs(dag, *args, **kwargs)
    return dag


def _walks(check) -> int:
    jobs = [Job(f"r{i}") for i in range(5)]
    dag = _fake_dag(jobs, {job: [] for job in jobs}, jobs)
    mapping = dict(dag._group)
    check(dag)
    assert dag._group == mapping  # the DAG's mapping given back as it was
    return sum(dag._dependencies.visits.values())


def test_snakemake_9_here_is_the_affected_version_and_the_fix_walks_each_group_once():
    assert snakemake_groups_fix.install()  # Snakemake 9.27.1: the redundant loop is in its source
    assert _walks(DAG._check_groups) == 5  # one look at each job's dependencies: nothing leaves the group
    original = DAG._check_groups.__wrapped__  # the function it wraps
    assert snakemake_groups_fix.REDUNDANT_LOOP in inspect.getsource(original)
    assert _walks(original) == 5 * 5  # Snakemake's own: the group once per member
    assert snakemake_groups_fix.install()  # once per process: a second call changes nothing


def test_a_group_that_depends_on_itself_is_still_refused():
    from snakemake.exceptions import WorkflowError

    assert snakemake_groups_fix.install()
    first, outside, last = Job("first"), Job("outside"), Job("last")
    # last -> outside (not in the group) -> first (in it again): the group would wait on itself
    dag = _fake_dag([first, outside, last], {last: [outside], outside: [first], first: []}, [first, last])
    with pytest.raises(WorkflowError, match="depends on itself"):
        DAG._check_groups(dag)


def _chain_dag(members: int) -> tuple[SimpleNamespace, Group]:
    """A group of `members` jobs, each behind a hub job that depends on 3 x `members` jobs upstream (the
    extraction jobs behind stop_server, behind every generation job)."""
    upstream = [Job(f"u{i}") for i in range(3 * members)]
    hub, grouped = Job("hub"), [Job(f"g{i}") for i in range(members)]
    dependencies = {job: [] for job in upstream} | {hub: upstream} | {job: [hub] for job in grouped}
    return _fake_dag([*upstream, hub, *grouped], dependencies, grouped), Group(grouped)


def test_a_group_nothing_leads_back_into_is_validated_in_one_walk():
    assert snakemake_groups_fix.install()
    dag, group = _chain_dag(100)
    DAG.validate_group(dag, group)  # no error: nothing upstream is in the group
    fixed = sum(dag._dependencies.visits.values())
    dag, group = _chain_dag(100)
    DAG.validate_group.__wrapped__(dag, group)  # Snakemake's own, the same verdict
    assert fixed < 500 < 100 * 300 < sum(dag._dependencies.visits.values())


def test_a_group_that_leads_back_into_itself_fails_validation_as_snakemake_s_own():
    from snakemake.exceptions import WorkflowError

    assert snakemake_groups_fix.install()
    first, outside, last = Job("first"), Job("outside"), Job("last")
    dag = _fake_dag([first, outside, last], {last: [outside], outside: [first], first: []}, [first, last])
    group = next(iter(dag._group.values()))
    with pytest.raises(WorkflowError, match="from outside the group, but they in turn depend on"):
        DAG.validate_group(dag, group)
