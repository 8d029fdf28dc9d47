"""Only stale work rebuilt, through Snakemake itself on the real demo pieces (the shared tiny target, the
real vLLM CPU server generating, states extracted by one vLLM extraction engine per call): after
`dataset.num_samples` is raised, the plan holds the new shards' prompt, generation, trace, budget and
extraction jobs and nothing of the done shards (counted), and a run of it leaves the done shards' hidden
states untouched."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from support.workflow import failure, job_counts, scratch_workdir, workdir_run

from eagle3_pipeline.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

SHARD_SIZE = 4


def _config(workdir: Path, num_samples: int, port: int) -> None:
    config = {
        "run": "inc",
        "demo": {"port": port},
        "dataset": {"num_samples": num_samples, "shard_size": SHARD_SIZE},
        "generation": {"max_tokens": 32},
        "hidden_states": {"max_seq_len": 256, "batch_tokens": 1024},  # the demo default: the vllm backend
    }
    (workdir / "c.yaml").write_text(yaml.safe_dump(config))


def _snakemake(workdir: Path, num_samples: int, *args: str) -> subprocess.CompletedProcess:
    shards = -(-num_samples // SHARD_SIZE)
    targets = [f"results/inc/hidden_states/train/shard-{k:05d}.safetensors" for k in range(shards)]
    result = workdir_run(workdir, *targets, "--configfile", "c.yaml", "--cores", "2", *args, timeout=1800)
    if result.returncode != 0:
        pytest.fail(failure(result, workdir / "results" / "inc" / "logs"))
    return result


def _states(workdir: Path) -> dict[str, int]:
    root = workdir / "results" / "inc" / "hidden_states"
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*.safetensors"))}


def test_raising_num_samples_extracts_only_the_new_shards(tmp_path):
    port = free_port()
    scratch_workdir(tmp_path, port)
    _config(tmp_path, 8, port)
    _snakemake(tmp_path, 8)
    before = _states(tmp_path)
    assert len(before) == 2 * 2  # 2 shards x 2 splits

    _config(tmp_path, 16, port)
    planned = dict(job_counts(_snakemake(tmp_path, 16, "-n", "--quiet", "rules").stdout))
    new = 16 // SHARD_SIZE - 2
    assert planned == {
        "write_prompt_shard": new,
        "generate_shard": new,
        "stop_server": 1,  # the new shards were generated: stop the server again
        "filter_traces": new,
        "check_disk_budget": new,
        "extract_hidden_states": new,
    }, planned

    _snakemake(tmp_path, 16)
    after = _states(tmp_path)
    assert len(after) == 4 * 2
    assert {name: after[name] for name in before} == before  # the done shards' states were not rewritten
    assert "Nothing to be done" in _snakemake(tmp_path, 16, "-n").stdout
    # one extraction engine per snakemake call, whatever the shards: the first run's and the second's
    metadata = (tmp_path / "results" / "inc" / "hidden_states").rglob("*.json")
    starts = {json.loads(path.read_text())["engine"]["start_id"] for path in metadata}
    assert len(starts) == 2, starts
