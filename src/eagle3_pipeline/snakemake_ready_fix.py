"""Snakemake 9 checks a group's readiness member by member, again for every member: a version-gated fix.

`DAG._ready(job)` (snakemake/dag.py, 9.27.1 here) answers for a grouped job whether every member of its
group has no unfinished dependency outside the group: a walk over all n members. `DAG.update_ready`
asks it for each job it is given and again for each member of a candidate group, and is called once
per finished job with the jobs that depend on it. A group of n jobs is thus walked n times per call,
and called for as each of its members' upstream jobs finish: n^2 walks of n members. The extraction
engine's groups (rules/hidden_states.smk: one engine job and its scope's extraction jobs) are as large
as the scope: a 1,000-shard plan's one group made about 4 million readiness checks, most of its dry run.

`install()` keeps the answer and the walk, and changes what is walked first:
- within one `update_ready` call nothing it reads changes (it only adds to the ready set), so a
  group's answer is computed once per call and reused for its other members;
- across calls, each group remembers the member that last held it back and starts there (its
  members in a fixed circular order): while that member still waits, the answer is False at once;
  once it is ready, the walk goes on from it and stops at the next member that waits. "Every member
  ready" is the same conjunction in any order, so the answer is Snakemake's own; a dependency count
  that only falls (as it does while a run or a dry run goes on) makes the walks linear in total.

Gated on what it fixes: Snakemake 9.x whose `_ready` walks the group (`for job in group`) and whose
`update_ready` asks it for each member (found in their source); anything else is left as it is.
"""

from __future__ import annotations

import inspect
from typing import Any

GROUP_WALK = "for job in group"
MEMBER_CHECK = "all(self._ready(job) for job in group)"
PATCHED = "_eagle3_pipeline_ready_once_per_group"  # marks the patched update_ready
_MEMO = "_eagle3_pipeline_ready_memo"  # the group answers of the update_ready call in progress
_WITNESS = "_eagle3_pipeline_ready_witness"  # group -> (its members, the one that last held it back)


def affected(dag_class: type) -> bool:
    """Whether `dag_class._ready` and `update_ready` are the versions that walk a group per member."""
    import snakemake

    ready, update = getattr(dag_class, "_ready", None), getattr(dag_class, "update_ready", None)
    if ready is None or update is None or not str(snakemake.__version__).startswith("9."):
        return False
    try:
        return GROUP_WALK in inspect.getsource(ready) and MEMBER_CHECK in inspect.getsource(update)
    except (OSError, TypeError):
        return False


def _member_ready(dag: Any, member: Any, group: Any) -> bool:
    """Snakemake's test for one member: no unfinished dependency outside its group."""
    internal = sum(dag._group.get(dep) == group for dep in dag._dependencies[member])
    return dag._n_until_ready[member] - internal == 0


def group_ready(dag: Any, group: Any) -> bool:
    """Whether every member of `group` is ready, walked from the member that last held it back."""
    witnesses = dag.__dict__.setdefault(_WITNESS, {})
    members, start = witnesses.get(group, (None, 0))
    if members is None or len(members) != len(group):  # new, or grown by a merge: its members again
        members, start = list(group), 0  # a fixed order: the position means the same member
    for step in range(len(members)):
        at = (start + step) % len(members)
        if not _member_ready(dag, members[at], group):
            witnesses[group] = (members, at)
            return False
    witnesses[group] = (members, start)
    return True


def install() -> bool:
    """Patch Snakemake's DAG once per process; True when the fix is (now or already) in place."""
    import snakemake.api  # noqa: F401 - loads snakemake.dag in the order its import cycle needs
    from snakemake.dag import DAG

    if getattr(DAG.update_ready, PATCHED, False):
        return True
    if not affected(DAG):
        return False
    original_ready, original_update = DAG._ready, DAG.update_ready

    def ready(self: Any, job: Any) -> bool:
        group = self._group.get(job, None)
        memo = self.__dict__.get(_MEMO)
        if group is None or memo is None:  # outside update_ready: Snakemake's own
            return original_ready(self, job)
        if group not in memo:
            memo[group] = group_ready(self, group)
        return memo[group]

    def update_ready(self: Any, jobs: Any = None) -> bool:
        self.__dict__[_MEMO] = {}
        try:
            return original_update(self, jobs)
        finally:
            del self.__dict__[_MEMO]

    ready.__wrapped__, update_ready.__wrapped__ = original_ready, original_update  # for the tests
    setattr(update_ready, PATCHED, True)
    DAG._ready, DAG.update_ready = ready, update_ready
    return True
