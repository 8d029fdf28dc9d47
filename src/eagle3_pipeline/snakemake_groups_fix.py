"""Snakemake 9 checks each job group once per member: a version-gated fix, applied by the Snakefile.

`DAG._check_groups` (snakemake/dag.py, 9.27.1 here) loops over `self._group.values()`, which maps every
grouped job to its group, so a group of n jobs is checked n times over, each time walking from each of
its n jobs through all their upstream jobs: n^2 walks per group where n give the same verdict. The
extraction engine's groups (rules/hidden_states.smk: one engine job and its scope's extraction jobs,
each upstream of every generation job through stop_server) make this most of a large plan's time:
`snakemake -n` of the Kimi example (30 groups of 35 jobs, 1,480 jobs) took 25.2 CPU seconds, 5.6 of them
outside this check. `install()` has the check see each group once: the same walks from the same jobs,
the same error for a group that depends on itself.

Gated on what it fixes: Snakemake 9.x whose `_check_groups` still reads `self._group.values()` (found in
its source); anything else is left as it is. Upstream, the fix is `for group in set(self._group.values())`
in `_check_groups`.
"""

from __future__ import annotations

import inspect
from typing import Any

REDUNDANT_LOOP = "for group in self._group.values():"
_PATCHED = "_eagle3_pipeline_checks_each_group_once"


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


def install() -> bool:
    """Patch Snakemake's DAG once per process; True when the fix is (now or already) in place."""
    import snakemake.api  # noqa: F401 - loads snakemake.dag in the order its import cycle needs
    from snakemake.dag import DAG

    if getattr(DAG._check_groups, _PATCHED, False):
        return True
    if not affected(DAG):
        return False
    original = DAG._check_groups

    def check_each_group_once(self: Any) -> None:
        every_job = self._group
        self._group = {group: group for group in set(every_job.values())}  # read as .values() only
        try:
            original(self)
        finally:
            self._group = every_job

    setattr(check_each_group_once, _PATCHED, True)
    DAG._check_groups = check_each_group_once
    return True
