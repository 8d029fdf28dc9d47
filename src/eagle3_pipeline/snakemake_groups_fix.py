"""Snakemake 9 checks each job group once per member, walking all upstream: a version-gated fix.

`DAG._check_groups` (snakemake/dag.py, 9.27.1 here) loops over `self._group.values()`, which maps every
grouped job to its group, so a group of n jobs is checked n times over, each time walking from each of
its n jobs through all their upstream jobs: n^2 walks per group where n give the same verdict. The
extraction engine's groups (rules/hidden_states.smk: one engine job and its scope's extraction jobs,
each upstream of every generation job through stop_server) make this most of a large plan's time:
`snakemake -n` of the Kimi example (30 groups of 35 jobs, 1,480 jobs) took 25.2 CPU seconds, 5.6 of them
outside this check. `install()` has the check see each group once: the same walks from the same jobs,
the same error for a group that depends on itself.

Both group checks (`_check_groups` and `DAG.validate_group`, which walks from every dependency outside
the group of every member, again for each member) look for one thing: a path that leaves the group and
comes back into it. Each member of an engine group depends on `stop_server`, behind which lies every
generation job, so both walk the whole upstream DAG once per member: quadratic in a 1,000-shard plan.
`may_reenter` answers first, in one walk (linear): from the group's outside dependencies, through outside
jobs only, is any member reached? When none is, neither check can find a path and both are skipped;
when one is, Snakemake's own check runs and raises its own error.

Gated on what it fixes: Snakemake 9.x whose `_check_groups` still reads `self._group.values()` (found in
its source); anything else is left as it is. Upstream, the fix is `for group in set(self._group.values())`
in `_check_groups`.
"""

from __future__ import annotations

import inspect
from typing import Any

REDUNDANT_LOOP = "for group in self._group.values():"
PATCHED = "_eagle3_pipeline_checks_each_group_once"  # marks the patched _check_groups


def affected(dag_class: type) -> bool:
    """Whether `dag_class._check_groups` is the version that checks a group once per member."""
    import snakemake

    check = getattr(dag_class, "_check_groups", None)
    if check is None or not str(snakemake.__version__).startswith("9."):
        return False
    try:
        return REDUNDANT_LOOP in inspect.getsource(check)
    except (OSError, TypeError):
        return False


def may_reenter(dag: Any, group: Any) -> bool:
    """Whether some path leaves `group` and comes back into it (False: neither check can fail)."""
    members = set(group)
    outside = {dep for job in members for dep in dag._dependencies[job] if dep not in members}
    queue, seen = list(outside), set(outside)
    while queue:
        for dep in dag._dependencies[queue.pop()]:
            if dep in members:
                return True
            if dep not in seen:
                seen.add(dep)
                queue.append(dep)
    return False


def install() -> bool:
    """Patch Snakemake's DAG once per process; True when the fix is (now or already) in place."""
    import snakemake.api  # noqa: F401 - loads snakemake.dag in the order its import cycle needs
    from snakemake.dag import DAG

    if getattr(DAG._check_groups, PATCHED, False):
        return True
    if not affected(DAG):
        return False
    original, original_validate = DAG._check_groups, DAG.validate_group

    def check_each_group_once(self: Any) -> None:
        every_job = self._group
        groups = {group for group in set(every_job.values()) if may_reenter(self, group)}
        self._group = {group: group for group in groups}  # read as .values() only
        try:
            original(self)
        finally:
            self._group = every_job

    def validate_group(self: Any, group: Any) -> None:
        if may_reenter(self, group):
            original_validate(self, group)

    check_each_group_once.__wrapped__ = original  # type: ignore[attr-defined]  # for the tests
    validate_group.__wrapped__ = original_validate  # type: ignore[attr-defined]
    setattr(check_each_group_once, PATCHED, True)
    DAG._check_groups, DAG.validate_group = check_each_group_once, validate_group
    return True
