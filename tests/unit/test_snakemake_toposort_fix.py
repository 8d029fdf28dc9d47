"""The Snakefile's fix of Snakemake 9's ordering of a group's pipe groups
(eagle3_pipeline.snakemake_toposort_fix): the same layers in the same order as Snakemake's own
`toposorted(jobs, inherit_pipe_dependencies=True)` on random small DAGs (and the same cycle where a path
leaves a pipe group and comes back), with a pipe group's members compared a linear number of times."""

from __future__ import annotations

import random
from graphlib import CycleError

import snakemake.api  # noqa: F401 - before snakemake.dag (its import cycle)
from snakemake.dag import DAG

from eagle3_pipeline import snakemake_toposort_fix


class Job:
    """A DAG job as toposorted reads it: its pipe group, and Snakemake's comparisons (by rule, no __eq__
    of its own)."""

    compared = 0

    def __init__(self, name: str, pipe_group: str | None = None) -> None:
        self.name, self.pipe_group = name, pipe_group

    def __lt__(self, other: Job) -> bool:
        return self.name < other.name

    def __eq__(self, other: object) -> bool:
        Job.compared += 1
        return self is other

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return self.name


class FakeDAG:
    """A DAG as toposorted reads it: its jobs and their dependencies."""

    def __init__(self, jobs: list[Job], dependencies: dict[Job, list[Job]]) -> None:
        self.jobs = jobs
        self._dependencies = {job: dict.fromkeys(deps, set()) for job, deps in dependencies.items()}


def _random_dag(rng: random.Random) -> tuple[FakeDAG, frozenset[Job]]:
    """Up to 30 jobs in up to 3 pipe groups (some in none), each depending on some jobs before it, and
    the jobs of one group job among them (as GroupJob.finalize passes them)."""
    jobs = [Job(f"j{i}", rng.choice([None, None, "p", "q", "r"])) for i in range(rng.randint(1, 30))]
    dependencies = {job: rng.sample(jobs[:i], rng.randint(0, min(i, 4))) for i, job in enumerate(jobs)}
    return FakeDAG(jobs, dependencies), frozenset(rng.sample(jobs, rng.randint(1, len(jobs))))


def _layers(toposorted, dag: FakeDAG, jobs) -> list[list[str]] | str:
    """The layers' job names, or the cycle error where a path leaves a pipe group and comes back (a
    plan Snakemake refuses before it orders anything)."""
    try:
        return [
            [job.name for job in layer] for layer in toposorted(dag, jobs, inherit_pipe_dependencies=True)
        ]
    except CycleError as error:
        return f"cycle {error.args[1]}"


def test_snakemake_9_27_1_here_is_the_version_repeated():
    assert snakemake_toposort_fix.install()  # its toposorted is byte for byte the one repeated
    assert snakemake_toposort_fix.affected(type("Original", (), {"toposorted": DAG.toposorted.__wrapped__}))
    assert snakemake_toposort_fix.install()  # once per process: a second call changes nothing


def test_the_fix_gives_snakemake_s_layers_in_snakemake_s_order():
    assert snakemake_toposort_fix.install()
    fixed, original = DAG.toposorted, DAG.toposorted.__wrapped__
    ordered = 0
    for seed in range(1000):
        dag, group = _random_dag(random.Random(seed))
        layers = _layers(original, dag, group)
        assert _layers(fixed, dag, group) == layers, f"seed {seed}"
        assert _layers(fixed, dag, None) == _layers(original, dag, None), f"seed {seed}: every job"
        ordered += isinstance(layers, list) and any(job.pipe_group for job in group)
    assert ordered > 300  # groups holding a pipe group, ordered
    dag, group = _random_dag(random.Random(0))
    assert list(fixed(dag, group)) == list(original(dag, group))  # without pipes: Snakemake's own


def _comparisons(toposorted, members: int) -> int:
    """Job comparisons ordering one pipe group of `members` jobs, each after its own upstream job."""
    upstream = [Job(f"u{i}") for i in range(members)]
    grouped = [Job(f"m{i}", "engine") for i in range(members)]
    dependencies = {job: [] for job in upstream} | {m: [u] for u, m in zip(upstream, grouped, strict=True)}
    Job.compared = 0
    layers = _layers(toposorted, FakeDAG(upstream + grouped, dependencies), frozenset(grouped))
    assert len(layers) == 1 and len(layers[0]) == members  # the group's members: one layer
    return Job.compared


def test_the_fix_orders_a_pipe_group_in_linear_time():
    assert snakemake_toposort_fix.install()
    assert _comparisons(DAG.toposorted.__wrapped__, 300) > 300 * 300 // 2  # Snakemake's own: a list scan
    assert _comparisons(DAG.toposorted, 300) < 300
