"""Snakemake 9 hides a job behind an ancient input from its own rerun reasons: a version-gated fix,
applied by the Snakefile.

`DAG.update_needrun` (snakemake/dag.py, 9.27.1 here) first checks each job in DAG order, skipping
("masking") every job downstream of one that must run, since the second pass (a BFS from the jobs
that run) will reach them. That BFS stops at an input flagged ancient that exists, and the masking
does not: a job behind such an input is never checked at all. In this workflow the baseline's
extraction waits on the main draft's offline validation through an ancient input (rules/common/
engine.smk, get_baseline_extraction_gate), so a changed `train.lr` retrained the main draft and left
the baseline's training, whose params changed too, for the next invocation (snakemake#4166).
`install()` has the masking stop where the BFS stops: a job reached only through ancient inputs is
checked on its own, as if nothing upstream of it ran.

Gated on what it fixes: Snakemake 9.x whose `update_needrun` still masks with
`masked.update(self.bfs(self.depending, job))` (found in its source); anything else is left as it is.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

MASKING = "masked.update(self.bfs(self.depending, job))"
_PATCHED = "_eagle3_pipeline_masks_like_its_bfs"
_MASKING_FLAG = "_eagle3_pipeline_masking"


def affected(dag_class: type) -> bool:
    """Whether `dag_class.update_needrun` masks through ancient inputs (the version this fixes)."""
    import snakemake

    update = getattr(dag_class, "update_needrun", None)
    if update is None or not str(snakemake.__version__).startswith("9."):
        return False
    try:
        return MASKING in inspect.getsource(update)
    except (OSError, TypeError):
        return False


def downstream_before_ancient(dag: Any, job: Any) -> Iterator[Any]:
    """`job` and every job downstream of it through at least one input that is not ancient: what the
    rerun BFS of update_needrun reaches from `job` (an ancient input that is missing is reached there
    too, and checked here on its own: the same verdict)."""
    queue, seen = deque([job]), {job}
    while queue:
        current = queue.popleft()
        yield current
        for consumer, files in dag.depending[current].items():
            if consumer in seen or (files and all(f.is_ancient for f in files)):
                continue
            seen.add(consumer)
            queue.append(consumer)


def install() -> bool:
    """Patch Snakemake's DAG once per process; True when the fix is (now or already) in place."""
    import snakemake.api  # noqa: F401 - loads snakemake.dag in the order its import cycle needs
    from snakemake.dag import DAG

    if getattr(DAG.update_needrun, _PATCHED, False):
        return True
    if not affected(DAG):
        return False
    original_update, original_bfs = DAG.update_needrun, DAG.bfs

    async def update_needrun(self: Any, *args: Any, **kwargs: Any) -> Any:
        setattr(self, _MASKING_FLAG, True)
        try:
            return await original_update(self, *args, **kwargs)
        finally:
            setattr(self, _MASKING_FLAG, False)

    def bfs(self: Any, direction: Any, *jobs: Any, stop: Callable[[Any], bool] | None = None) -> Any:
        # update_needrun's only one-job, stop-free walk downstream is its masking
        if (
            getattr(self, _MASKING_FLAG, False)
            and direction is self.depending
            and len(jobs) == 1
            and stop is None
        ):
            return downstream_before_ancient(self, jobs[0])
        return (
            original_bfs(self, direction, *jobs)
            if stop is None
            else original_bfs(self, direction, *jobs, stop=stop)
        )

    setattr(update_needrun, _PATCHED, True)
    DAG.update_needrun, DAG.bfs = update_needrun, bfs
    return True
