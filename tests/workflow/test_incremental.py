"""Only stale work rebuilt, through Snakemake itself on the real demo pieces (the shared tiny target, the
real vLLM CPU server generating, states extracted by one vLLM extraction engine per call): a copy of the
session's finished demo run (support.workflow.demo_e2e_workdir, 3 shards of 32) is up to date; after
`dataset.num_samples` is raised by two shards (a full one and a partial one), the plan holds the new
shards' prompt, generation, trace, budget and extraction jobs and nothing of the done shards (counted),
and a run of it leaves the done shards' hidden states untouched."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from support.workflow import copy_workdir, failure, job_counts, workdir_run

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

DONE_SAMPLES = 96  # the session's demo run: support.workflow.e2e_overrides
SHARD_SIZE = 32
GROWN_SAMPLES = DONE_SAMPLES + SHARD_SIZE + 8  # two new shards: a full one and a partial one


def _config(workdir: Path, num_samples: int) -> None:
    config = yaml.safe_load((workdir / "e2e.yaml").read_text())
    assert config["dataset"] == {"num_samples": DONE_SAMPLES, "shard_size": SHARD_SIZE}
    config["dataset"]["num_samples"] = num_samples
    (workdir / "c.yaml").write_text(yaml.safe_dump(config))


def _snakemake(workdir: Path, num_samples: int, *args: str) -> subprocess.CompletedProcess:
    shards = -(-num_samples // SHARD_SIZE)
    targets = [f"results/e2e/hidden_states/train/shard-{k:05d}.safetensors" for k in range(shards)]
    result = workdir_run(workdir, *targets, "--configfile", "c.yaml", "--cores", "2", *args, timeout=1800)
    if result.returncode != 0:
        pytest.fail(failure(result, workdir / "results" / "e2e" / "logs"))
    return result


def _states(workdir: Path) -> dict[str, int]:
    root = workdir / "results" / "e2e" / "hidden_states"
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*.safetensors"))}


def _engine_starts(workdir: Path, shards: range) -> set[str]:
    """The extraction engines (start ids) that wrote these shards' states, both splits."""
    root = workdir / "results" / "e2e" / "hidden_states"
    metadata = [path for k in shards for path in root.glob(f"*/shard-{k:05d}.json")]
    assert len(metadata) == 2 * len(shards), metadata
    return {json.loads(path.read_text())["engine"]["start_id"] for path in metadata}


def test_raising_num_samples_extracts_only_the_new_shards(demo_e2e_workdir, tmp_path):
    workdir = copy_workdir(demo_e2e_workdir, tmp_path / "inc")
    _config(workdir, DONE_SAMPLES)
    assert "Nothing to be done" in _snakemake(workdir, DONE_SAMPLES, "-n").stdout  # the copy is done
    before = _states(workdir)
    done = DONE_SAMPLES // SHARD_SIZE
    assert len(before) == done * 2  # 3 shards x 2 splits

    _config(workdir, GROWN_SAMPLES)
    planned = dict(job_counts(_snakemake(workdir, GROWN_SAMPLES, "-n", "--quiet", "rules").stdout))
    new = -(-GROWN_SAMPLES // SHARD_SIZE) - done
    assert new == 2
    assert planned == {
        "write_prompt_shard": new,
        "generate_shard": new,
        "stop_server": 1,  # the new shards were generated: stop the server again
        "filter_traces": new,
        "check_disk_budget": new,
        "serve_extraction_engine": 1,  # for the new shards only: the done ones do not consume it
        "extract_hidden_states": new,
    }, planned

    _snakemake(workdir, GROWN_SAMPLES)
    after = _states(workdir)
    assert len(after) == (done + new) * 2
    assert {name: after[name] for name in before} == before  # the done shards' states were not rewritten
    assert "Nothing to be done" in _snakemake(workdir, GROWN_SAMPLES, "-n").stdout
    # one extraction engine per snakemake call, whatever the shards: the session run's and this one's
    first, second = _engine_starts(workdir, range(done)), _engine_starts(workdir, range(done, done + new))
    assert len(first) == len(second) == 1 and len(first | second) == 2, (first, second)
