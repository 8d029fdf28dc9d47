"""The Snakefile's fixes of Snakemake 9's per-job planning costs, on real DAGs of small workflows planned
in this process: the same DAG as Snakemake's own code plans, with a producer's inputs scanned once
(eagle3_pipeline.snakemake_producer_fix) and a rule's script read once (snakemake_script_fix)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import snakemake.api  # noqa: F401 - before snakemake.dag (its import cycle)
import snakemake.io
import snakemake.script
from snakemake.dag import DAG, ScriptProcessor
from snakemake.exceptions import WorkflowError
from support.workflow import planned_dag

from eagle3_pipeline import snakemake_producer_fix, snakemake_script_fix

# A job with an input per shard whose output every shard's job consumes: stop_server's shape
FAN_IN_FAN_OUT = """
SHARDS = range(config["shards"])

rule all:
    input: expand("c/{s}.txt", s=SHARDS)

rule a:
    output: "a/{s}.txt"
    shell: "touch {output}"

rule gather:
    input: expand("a/{s}.txt", s=SHARDS)
    output: "gathered.txt"
    shell: "touch {output}"

rule c:
    input: "a/{s}.txt", "gathered.txt"
    output: "c/{s}.txt"
    shell: "touch {output}"
"""

# A constant script for every shard, and a script named by a wildcard
SCRIPTS = """
rule all:
    input: expand("out/{s}.txt", s=range(config["shards"])), expand("per/{name}.txt", name=["p", "q"])

rule make:
    output: "out/{s}.txt"
    script: "scripts/make.py"

rule per:
    output: "per/{name}.txt"
    script: "scripts/{wildcards.name}.py"
"""


def _workflow(folder: Path, snakefile: str, scripts: tuple[str, ...] = ()) -> Path:
    folder.mkdir()
    (folder / "Snakefile").write_text(snakefile)
    for name in scripts:
        (folder / "scripts").mkdir(exist_ok=True)
        (folder / "scripts" / name).write_text("print(snakemake.output)\n")
    return folder


def _name(job) -> str:
    return f"{job.rule.name}{sorted(job.wildcards_dict.items())}"


def _edges(dag) -> list[tuple[str, str, list[str]]]:
    """Every dependency of the DAG: (job, the job it depends on, the files it gives)."""
    return sorted(
        (_name(job), _name(dependency), sorted(map(str, files)))
        for job, dependencies in dag._dependencies.items()
        for dependency, files in dependencies.items()
    )


def _compared(monkeypatch) -> list[int]:
    """Count the file comparisons made while planning (the scan of a producer's inputs is one per input)."""
    comparisons = []
    real = snakemake.io._IOFile.__eq__

    def counting(self, other):
        comparisons.append(1)
        return real(self, other)

    monkeypatch.setattr(snakemake.io._IOFile, "__eq__", counting)
    return comparisons


def test_snakemake_9_here_is_the_affected_version():
    assert snakemake_producer_fix.install() and snakemake_script_fix.install()
    assert snakemake_producer_fix.CYCLE_SCAN in inspect.getsource(DAG.update.__wrapped__)
    assert snakemake_producer_fix.KNOWN_JOB in inspect.getsource(DAG.update_)
    assert snakemake_script_fix.PER_JOB_READ in inspect.getsource(ScriptProcessor.process_job.__wrapped__)
    assert snakemake_producer_fix.install() and snakemake_script_fix.install()  # once per process


def test_the_producer_fix_plans_snakemake_s_dag_without_scanning_per_consumer(tmp_path, monkeypatch):
    assert snakemake_producer_fix.install()
    workdir, shards = _workflow(tmp_path / "fan", FAN_IN_FAN_OUT), 500
    comparisons = _compared(monkeypatch)
    fixed, fixed_comparisons = _edges(planned_dag(workdir, {"shards": shards})), len(comparisons)
    monkeypatch.setattr(DAG, "update", DAG.update.__wrapped__)  # Snakemake's own
    comparisons.clear()
    original = _edges(planned_dag(workdir, {"shards": shards}))
    assert fixed == original
    assert len(original) == 4 * shards  # a -> c, a -> gather, gather -> c, c -> all
    assert len(comparisons) > shards * shards  # gather's inputs scanned for each c job
    assert fixed_comparisons < 100 * shards  # a few per job


def test_the_producer_fix_leaves_every_other_case_to_snakemake(tmp_path):
    assert snakemake_producer_fix.install()
    dag = planned_dag(_workflow(tmp_path / "fan", FAN_IN_FAN_OUT), {"shards": 20})
    gather = next(job for job in dag.jobs if job.rule.name == "gather")
    a_job = next(job for job in dag.jobs if job.rule.name == "a")
    produced, consumed = gather.output[0], gather.input[0]
    assert snakemake_producer_fix.known_producer(dag, [gather], produced, set()) is gather
    assert snakemake_producer_fix.known_producer(dag, [gather], consumed, set()) is None  # a cycle
    assert snakemake_producer_fix.known_producer(dag, [gather], produced, {gather}) is None  # on the path
    assert snakemake_producer_fix.known_producer(dag, [gather, a_job], produced, set()) is None  # a choice
    assert snakemake_producer_fix.known_producer(dag, [gather], None, set()) is None  # a target
    del dag._dependencies[gather]  # not yet planned: update_ walks it
    assert snakemake_producer_fix.known_producer(dag, [gather], produced, set()) is None


def _reads(monkeypatch) -> list[str]:
    """The scripts Snakemake reads while planning (script.get_source, as ScriptProcessor calls it)."""
    reads = []
    real = snakemake.script.get_source

    def counting(path, *args, **kwargs):
        reads.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(snakemake.script, "get_source", counting)
    return reads


def test_the_script_fix_reads_a_constant_script_once_per_plan(tmp_path, monkeypatch):
    assert snakemake_script_fix.install()
    workdir = _workflow(tmp_path / "flow", SCRIPTS, ("make.py", "p.py", "q.py"))
    reads = _reads(monkeypatch)
    fixed = _edges(planned_dag(workdir, {"shards": 50}))
    assert sorted(reads) == ["scripts/make.py", "scripts/{wildcards.name}.py", "scripts/{wildcards.name}.py"]
    monkeypatch.setattr(ScriptProcessor, "process_job", ScriptProcessor.process_job.__wrapped__)
    reads.clear()
    assert _edges(planned_dag(workdir, {"shards": 50})) == fixed
    assert reads.count("scripts/make.py") == 50  # Snakemake's own: once per job


@pytest.mark.parametrize("missing", ["make.py", "q.py"])
def test_a_missing_script_stops_the_plan_as_snakemake_stops_it(tmp_path, monkeypatch, missing):
    assert snakemake_script_fix.install()
    scripts = tuple(name for name in ("make.py", "p.py", "q.py") if name != missing)
    workdir = _workflow(tmp_path / "flow", SCRIPTS, scripts)
    with pytest.raises((OSError, WorkflowError)) as fixed:  # 9.27.1: the FileNotFoundError of its read
        planned_dag(workdir, {"shards": 5})
    monkeypatch.setattr(ScriptProcessor, "process_job", ScriptProcessor.process_job.__wrapped__)
    with pytest.raises((OSError, WorkflowError)) as original:
        planned_dag(workdir, {"shards": 5})
    assert (type(fixed.value), str(fixed.value)) == (type(original.value), str(original.value))
    assert missing in str(fixed.value)
