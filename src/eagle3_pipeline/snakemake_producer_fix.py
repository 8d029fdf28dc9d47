"""Snakemake 9 scans a producer's inputs for each consumer of its output: a version-gated fix.

`DAG.update` (snakemake/dag.py, 9.27.1 here) is asked, for each input file of each job, to pick the
file's producer among its candidate jobs. Before anything else it tests each candidate for a cycle,
`file in job.input`: a scan of the candidate's input list, again for every consumer, even when the
candidate is already in the DAG. Two jobs of this workflow have an input per shard and an output that
a job per shard consumes: stop_server (every generation shard; every extraction job waits on it) and,
with the baseline, the main draft's validate_offline (every hidden-state shard; every baseline
extraction waits on it). Their scans grow with the square of the shard count: 3 million comparisons
at 1,000 shards (1.4-3.3 CPU seconds), a hundred times as many at 10,000.

`install()` answers at once the case that costs: one candidate, already in the DAG (so `update_` would
return at once), not on the path being walked, passing Snakemake's periodic-wildcard check, and not
consuming the file, tested against a set of its inputs built once per job (and again if its input list
is replaced). That is the job `update` would pick, logged as it logs it. Any other case (several
candidates, a new job, a cycle, a periodic wildcard) goes to Snakemake's own `update`.

Gated on what it fixes: Snakemake 9.x whose `update` scans `job.input` for each candidate and whose
`update_` returns at once for a job already in the DAG (found in their source); anything else is left
as it is.
"""

from __future__ import annotations

import inspect
from typing import Any

CYCLE_SCAN = "if file in job.input and not any("
KNOWN_JOB = "if job in self._dependencies:\n            return"
PATCHED = "_eagle3_pipeline_producer_known"  # marks the patched update
_INPUTS = "_eagle3_pipeline_input_sets"  # on a DAG: job -> (its input list, a set of it)
SCAN_BELOW = 16  # inputs: a shorter list is scanned as Snakemake scans it


def affected(dag_class: type) -> bool:
    """Whether `dag_class.update` scans each candidate's inputs and `update_` returns at once for a job
    already in the DAG (the versions this fix replays)."""
    import snakemake

    update, update_ = getattr(dag_class, "update", None), getattr(dag_class, "update_", None)
    if update is None or update_ is None or not str(snakemake.__version__).startswith("9."):
        return False
    try:
        return CYCLE_SCAN in inspect.getsource(update) and KNOWN_JOB in inspect.getsource(update_)
    except (OSError, TypeError):
        return False


def consumes(dag: Any, job: Any, file: Any) -> bool:
    """`file in job.input`, with a set of a long input list kept per job."""
    inputs = job.input
    if len(inputs) < SCAN_BELOW:
        return file in inputs
    kept = dag.__dict__.setdefault(_INPUTS, {})
    entry = kept.get(job)
    if entry is None or entry[0] is not inputs or entry[1] != len(inputs):
        entry = (inputs, len(inputs), frozenset(inputs))
        kept[job] = entry
    return file in entry[2]


def known_producer(dag: Any, jobs: Any, file: Any, visited: Any) -> Any | None:
    """The job `DAG.update(jobs, file, visited)` would pick without walking anything, or None when the
    case is not that simple."""
    from snakemake.exceptions import PeriodicWildcardError

    if file is None or visited is None or len(jobs) != 1:
        return None
    (job,) = jobs
    if job not in dag._dependencies or job in visited or consumes(dag, job, file):
        return None
    try:
        dag.check_periodic_wildcards(job)
    except PeriodicWildcardError:
        return None
    return job


def install() -> bool:
    """Patch Snakemake's DAG once per process; True when the fix is (now or already) in place."""
    import snakemake.api  # noqa: F401 - loads snakemake.dag in the order its import cycle needs
    from snakemake import dag as snakemake_dag
    from snakemake.dag import DAG

    if getattr(DAG.update, PATCHED, False):
        return True
    if not affected(DAG):
        return False
    original = DAG.update
    logger, event = snakemake_dag.logger, snakemake_dag.LogEvent.DEBUG_DAG

    async def update(
        self: Any,
        jobs: Any,
        file: Any = None,
        visited: Any = None,
        known_producers: Any = None,
        progress: bool = False,
        create_inventory: bool = False,
    ) -> Any:
        job = known_producer(self, jobs, file, visited)
        if job is None:
            return await original(self, jobs, file, visited, known_producers, progress, create_inventory)
        # what Snakemake's update logs on the way to the same answer
        logger.debug(None, extra=dict(event=event, status="candidate", job=job))
        n = len(self._dependencies)
        if progress and n % 1000 == 0 and n and self._progress != n:
            logger.info(f"Processed {n} potential jobs.")
            self._progress = n
        logger.debug(f"Selected {job.rule.name}", extra=dict(event=event, status="selected", job=job))
        return job

    update.__wrapped__ = original  # type: ignore[attr-defined]  # for the tests
    setattr(update, PATCHED, True)
    DAG.update = update
    return True
