"""The Snakefile's fix of Snakemake 9's readiness check (eagle3_pipeline.snakemake_ready_fix): the same
ready jobs and groups as Snakemake's own `update_ready` on small DAGs, state after state, with a group's
members walked far fewer times."""

from __future__ import annotations

import inspect
import random
from collections import Counter

import snakemake.api  # noqa: F401 - before snakemake.dag (its import cycle)
from snakemake.dag import DAG

from eagle3_pipeline import snakemake_ready_fix


class Job:
    """A DAG job as the readiness check reads it."""

    def __init__(self, name: str, group: str | None = None) -> None:
        self.name, self.group, self.output = name, group, [name]

    def has_unfinished_queue_input(self) -> bool:
        return False

    def __repr__(self) -> str:
        return self.name


class Group(frozenset):
    """A group job as the check reads it: its jobs (hashed and compared as Snakemake's GroupJob)."""


class CountingDependencies(dict):
    """A DAG's `_dependencies` that counts the walks' visits."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.visits = 0

    def __getitem__(self, job):
        self.visits += 1
        return super().__getitem__(job)


def _dag_class(fixed: bool) -> type:
    """A DAG with Snakemake's (fixed False) or the fix's `_ready` and `update_ready`, nothing else."""
    ready, update = DAG._ready, DAG.update_ready
    if not fixed:
        ready, update = ready.__wrapped__, update.__wrapped__

    class FakeDAG:
        _ready, update_ready = ready, update

        def __init__(self, jobs, dependencies, groups, n_until_ready):
            self.jobs, self._dependencies = jobs, CountingDependencies(dependencies)
            self._group = {job: group for group in groups for job in group}
            self._n_until_ready, self._ready_jobs, self._running = n_until_ready, set(), set()

        def needrun_jobs(self):
            return self.jobs

        def finished(self, job):
            return False

    return FakeDAG


def _random_dag(rng: random.Random) -> tuple[list[Job], dict, list[Group]]:
    """Up to 12 jobs in up to 3 groups (some left out), each depending on some jobs before it."""
    jobs = [Job(f"j{i}") for i in range(rng.randint(2, 12))]
    dependencies = {job: rng.sample(jobs[:i], rng.randint(0, min(i, 3))) for i, job in enumerate(jobs)}
    labels = [rng.choice([None, "a", "b", "c"]) for _ in jobs]
    groups = [Group(j for j, label in zip(jobs, labels, strict=True) if label == name) for name in "abc"]
    groups = [group for group in groups if group]
    for group in groups:
        for job in group:
            job.group = "g"
    return jobs, dependencies, groups


def _ready_after_each_step(fixed: bool, seed: int) -> list[tuple[bool, set[str]]]:
    """update_ready's answer and ready set after each of 20 changes of the dependency counts: mostly
    falling (a run going on), now and then rising (Snakemake recounting)."""
    rng = random.Random(seed)
    jobs, dependencies, groups = _random_dag(rng)
    counts = {job: len(dependencies[job]) for job in jobs}
    dag = _dag_class(fixed)(jobs, dependencies, groups, counts)
    answers = []
    for _ in range(20):
        job = rng.choice(jobs)
        counts[job] = max(0, counts[job] + (1 if rng.random() < 0.15 else -1))
        dag._ready_jobs = set()
        asked = rng.sample(jobs, rng.randint(1, len(jobs)))
        answer = dag.update_ready(asked)
        ready = {f"group {sorted(map(str, j))}" if isinstance(j, Group) else str(j) for j in dag._ready_jobs}
        answers.append((answer, ready))
    return answers


def test_snakemake_9_here_is_the_affected_version():
    assert snakemake_ready_fix.install()  # Snakemake 9.27.1: the walk per member is in its source
    assert snakemake_ready_fix.GROUP_WALK in inspect.getsource(DAG._ready.__wrapped__)
    assert snakemake_ready_fix.MEMBER_CHECK in inspect.getsource(DAG.update_ready.__wrapped__)
    assert snakemake_ready_fix.install()  # once per process: a second call changes nothing


def test_the_fix_finds_the_same_ready_jobs_and_groups_as_snakemake():
    assert snakemake_ready_fix.install()
    outcomes = Counter()
    for seed in range(300):
        fixed, original = _ready_after_each_step(True, seed), _ready_after_each_step(False, seed)
        assert fixed == original, f"seed {seed}"
        outcomes.update(any(name.startswith("group") for name in ready) for _, ready in original)
    assert outcomes[True] > 500 and outcomes[False] > 500  # groups found ready and found waiting


def _visits(fixed: bool, members: int) -> int:
    """Dependency lookups for a group of `members` jobs behind one upstream job each, as each
    upstream job finishes and Snakemake asks about the member that depends on it."""
    upstream = [Job(f"u{i}") for i in range(members)]
    grouped = [Job(f"m{i}", "g") for i in range(members)]
    dependencies = {job: [] for job in upstream} | {m: [u] for u, m in zip(upstream, grouped, strict=True)}
    counts = dict.fromkeys(upstream, 0) | dict.fromkeys(grouped, 1)
    dag = _dag_class(fixed)(upstream + grouped, dependencies, [Group(grouped)], counts)
    for member in grouped:
        counts[member] = 0
        dag.update_ready([member])
    assert len(dag._ready_jobs) == 1  # the group, once its last member's dependency finished
    return dag._dependencies.visits


def test_the_fix_walks_a_group_linearly():
    assert snakemake_ready_fix.install()
    assert _visits(False, 200) > 200 * 200  # Snakemake's own: the group walked for every member
    assert _visits(True, 200) < 5 * 200
