"""Snakemake 9 reads a rule's script once per job while it plans: a version-gated fix.

`ScriptProcessor.process_job` (snakemake/dag.py, 9.27.1 here) checks, for every job that runs, that its
`script:` can be read: it formats the path with the job's wildcards and params, parses it as a URI,
copies it into the source cache when absent and reads it whole (script.get_source). Every rule of this
workflow is a `script:` whose path is a constant, so a 1,000-shard dry run (7,046 jobs) read its
30 scripts 7,000 times: 4.5-5.2 of its 26 CPU seconds (docs/cluster.md#planning-at-scale).

`install()` checks a constant path (no `{` or `}`: formatting it with any wildcards and params gives
the path itself) once per rule script and source folder in each DAG, with Snakemake's own check, and
skips it for the other jobs that name it. A path with wildcards or params, or a source given as a
SourceFile object, is checked per job as before. The one difference: a script deleted while the DAG
is being planned is caught by the job that runs it rather than at planning.

Gated on what it fixes: Snakemake 9.x whose `ScriptProcessor.process_job` calls `script.get_source`
with the job's wildcards (found in its source); anything else is left as it is.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

PER_JOB_READ = "script.get_source("
FORMATTED_WITH = "job.wildcards"
PATCHED = "_eagle3_pipeline_script_read_once"  # marks the patched process_job
_CHECKED = "_eagle3_pipeline_checked_scripts"  # on a processor: the constant paths it has checked


def affected(processor_class: type) -> bool:
    """Whether `processor_class.process_job` is the version that reads the script for every job."""
    import snakemake

    process = getattr(processor_class, "process_job", None)
    if process is None or not str(snakemake.__version__).startswith("9."):
        return False
    try:
        source = inspect.getsource(process)
    except (OSError, TypeError):
        return False
    return PER_JOB_READ in source and FORMATTED_WITH in source


def constant_entry(processor: Any, job: Any) -> tuple[str, str, str] | None:
    """The key of `job`'s script when its path is the same for every job of the rule, else None."""
    if not getattr(job, f"is_{processor.script_type}"):
        return None
    entry = getattr(job.rule, processor.script_type)
    if not isinstance(entry, str | Path) or any(brace in str(entry) for brace in "{}"):
        return None
    return processor.script_type, str(entry), str(job.rule.basedir)


def install() -> bool:
    """Patch Snakemake's script check once per process; True when the fix is (now or already) in place."""
    import snakemake.api  # noqa: F401 - loads snakemake.dag in the order its import cycle needs
    from snakemake.dag import ScriptProcessor

    if getattr(ScriptProcessor.process_job, PATCHED, False):
        return True
    if not affected(ScriptProcessor):
        return False
    original = ScriptProcessor.process_job

    def process_job(self: Any, job: Any) -> None:
        key = constant_entry(self, job)
        if key is None:
            original(self, job)
            return
        checked = self.__dict__.setdefault(_CHECKED, set())
        if key not in checked:
            original(self, job)  # raises as Snakemake does when the script cannot be read
            checked.add(key)

    process_job.__wrapped__ = original  # type: ignore[attr-defined]  # for the tests
    setattr(process_job, PATCHED, True)
    ScriptProcessor.process_job = process_job
    return True
