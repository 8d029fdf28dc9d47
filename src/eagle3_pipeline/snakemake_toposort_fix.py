"""Snakemake 9 orders a job group's pipe group in time quadratic in its size: a version-gated fix.

`GroupJob.finalize` orders a group's jobs with `DAG.toposorted(jobs, inherit_pipe_dependencies=True)`
(snakemake/dag.py, 9.27.1 here), which gives every member of a pipe group (the jobs joined by a pipe
or a service() output) the dependencies of all of them. It gathers those by testing each dependency of
each member against the members as a list (n^2 comparisons of Python objects), then filters that
union once per member (n x its size). The extraction engine's group (rules/hidden_states.smk: the
engine job and every extraction job of its scope, joined by its service() output) is such a pipe group
of 1,001 jobs at 1,000 shards: 1.7 CPU seconds of the dry run, about a hundred times that at 10,000.

`install()` answers that call with the same steps on sets: the members tested as a set, and each pipe
group's union filtered once and given to each member. The same layers, in the same order
(tests/unit/test_snakemake_toposort_fix.py); any other call of `toposorted` is Snakemake's own.

Gated on what it fixes: the function is repeated here whole, so only the `toposorted` of Snakemake
9.27.1 (its source, byte for byte: SOURCE_SHA256) is patched; anything else is left as it is.
"""

from __future__ import annotations

import hashlib
import inspect
from collections import defaultdict
from collections.abc import Iterator
from itertools import chain, groupby
from operator import attrgetter
from typing import Any

SOURCE_SHA256 = "ad1bb1e2621d2674854ed4548e0f2e2fb23c77080d5c4686eb53338b6144a9f5"  # Snakemake 9.27.1's
PATCHED = "_eagle3_pipeline_pipe_groups_as_sets"  # marks the patched toposorted


def affected(dag_class: type) -> bool:
    """Whether `dag_class.toposorted` is the one repeated here (Snakemake 9.27.1's)."""
    toposorted = getattr(dag_class, "toposorted", None)
    if toposorted is None:
        return False
    try:
        source = inspect.getsource(toposorted)
    except (OSError, TypeError):
        return False
    return hashlib.sha256(source.encode()).hexdigest() == SOURCE_SHA256


def _pipe_dependencies(dag: Any, jobs: Any) -> dict[Any, set[Any]]:
    """Each pipe group's dependencies outside it, as Snakemake gathers them (members tested as a set)."""
    pipe_groups: dict[Any, list[Any]] = defaultdict(list)
    for name, group in groupby(jobs, attrgetter("pipe_group")):
        if name is not None:
            pipe_groups[name].extend(group)
    pipe_dependencies = {}
    for name, group in pipe_groups.items():
        members = set(group)
        pipe_dependencies[name] = set(d for job in group for d in dag._dependencies[job] if d not in members)
    return pipe_dependencies


def toposorted_pipes(dag: Any, jobs: Any = None) -> Iterator[list[Any]]:
    """Snakemake's `toposorted(jobs, inherit_pipe_dependencies=True)`, its steps on sets."""
    from snakemake.dag import toposort

    if jobs is None:
        jobs = set(dag.jobs)
    pipe_dependencies = _pipe_dependencies(dag, jobs)
    # a pipe group's dependencies among `jobs`, filtered once, in the order Snakemake adds them to each
    # member's set (so that each set, built the same way, iterates as Snakemake's)
    within: dict[Any, list[Any]] = {}
    dependencies = {}
    for job in jobs:
        if job.pipe_group in pipe_dependencies:
            if job.pipe_group not in within:
                within[job.pipe_group] = [dep for dep in pipe_dependencies[job.pipe_group] if dep in jobs]
            dependencies[job] = set(within[job.pipe_group])
        else:
            dependencies[job] = {dep for dep in dag._dependencies[job] if dep in jobs}
    # from here as Snakemake: pipe jobs within a layer in their order of dependence
    for layer in toposort(dependencies):
        pipe_groups: dict[Any, set[Any]] = defaultdict(set)
        sorted_layer = []
        for job in layer:
            if job.pipe_group is None:
                sorted_layer.append(job)
                continue
            pipe_groups[job.pipe_group].add(job)
        for group in pipe_groups.values():
            sorted_layer.extend(
                chain.from_iterable(
                    toposort({job: {dep for dep in dag._dependencies[job] if dep in group} for job in group})
                )
            )
        yield sorted_layer


def install() -> bool:
    """Patch Snakemake's DAG once per process; True when the fix is (now or already) in place."""
    import snakemake.api  # noqa: F401 - loads snakemake.dag in the order its import cycle needs
    from snakemake.dag import DAG

    if getattr(DAG.toposorted, PATCHED, False):
        return True
    if not affected(DAG):
        return False
    original = DAG.toposorted

    def toposorted(self: Any, jobs: Any = None, inherit_pipe_dependencies: bool = False) -> Iterator[Any]:
        if inherit_pipe_dependencies:
            return toposorted_pipes(self, jobs)
        return original(self, jobs, inherit_pipe_dependencies)

    toposorted.__wrapped__ = original  # type: ignore[attr-defined]  # for the tests
    setattr(toposorted, PATCHED, True)
    DAG.toposorted = toposorted
    return True
