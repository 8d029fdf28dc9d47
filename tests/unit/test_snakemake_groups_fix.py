"""The Snakefile's fix of Snakemake 9's group check (eagle3_pipeline.snakemake_groups_fix): each group is
checked once, not once per member, with the same verdict on a group that depends on itself."""

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


class Group(frozenset):
    """A group job as the check reads it: its jobs, and its id for the error."""

    groupid = "g"


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
    return SimpleNamespace(
        _group={job: group for job in grouped}, _dependencies=CountingDependencies(dependencies)
    )


def _walks(check) -> int:
    jobs = [Job(f"r{i}") for i in range(5)]
    dag = _fake_dag(jobs, {job: [] for job in jobs}, jobs)
    mapping = dict(dag._group)
    check(dag)
    assert dag._group == mapping  # the DAG's mapping given back as it was
    return sum(dag._dependencies.visits.values())


def test_snakemake_9_here_is_the_affected_version_and_the_fix_walks_each_group_once():
    assert snakemake_groups_fix.install()  # Snakemake 9.27.1: the redundant loop is in its source
    assert _walks(DAG._check_groups) == 5  # one walk per job of the group
    original = DAG._check_groups.__closure__[0].cell_contents  # the function it wraps
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
