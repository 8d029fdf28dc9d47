"""Rules prepare_prompts and write_prompt_shard through Snakemake itself: one job per shard, the done
shards neither planned nor rewritten after dataset.num_samples is raised (the selection block does not
depend on it), a changed seed or shard size reselects, a second run does nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from support.workflow import job_counts, workdir_run

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def snakemake(workdir: Path, dataset: dict, *args: str) -> subprocess.CompletedProcess:
    shards = -(-dataset["num_samples"] // dataset["shard_size"])
    config = {"run": "p", "demo": {"enabled": False}, "dataset": dataset}
    (workdir / "c.yaml").write_text(yaml.safe_dump(config))
    targets = [f"results/p/prompts/shard-{k:05d}.parquet" for k in range(shards)]
    result = workdir_run(workdir, *targets, "--configfile", "c.yaml", "--cores", "1", *args, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def planned(workdir: Path, dataset: dict) -> dict[str, int]:
    return dict(job_counts(snakemake(workdir, dataset, "-n", "--quiet", "rules").stdout))


def shard_bytes(workdir: Path) -> dict[str, bytes]:
    shards = sorted((workdir / "results" / "p" / "prompts").glob("shard-*.parquet"))
    return {path.name: path.read_bytes() for path in shards}


def test_shards_grow_by_appending_and_reselect_on_seed_or_size(tmp_path):
    (tmp_path / "config").symlink_to(REPO / "config")
    dataset = {"path": "config/demo/sample.jsonl", "num_samples": 80, "shard_size": 32}
    assert planned(tmp_path, dataset) == {"prepare_prompts": 1, "write_prompt_shard": 3}
    snakemake(tmp_path, dataset)
    before = shard_bytes(tmp_path)
    assert list(before) == ["shard-00000.parquet", "shard-00001.parquet", "shard-00002.parquet"]
    assert "Nothing to be done" in snakemake(tmp_path, dataset, "-n").stdout

    raised = dataset | {"num_samples": 160}  # shard 2 was 16 questions short; 3 and 4 are new
    # the selection block does not depend on num_samples: nothing done is planned again
    assert planned(tmp_path, raised) == {"write_prompt_shard": 3}
    snakemake(tmp_path, raised)
    after = shard_bytes(tmp_path)
    assert len(after) == 5
    assert after["shard-00000.parquet"] == before["shard-00000.parquet"]
    assert after["shard-00001.parquet"] == before["shard-00001.parquet"]
    assert after["shard-00002.parquet"] != before["shard-00002.parquet"]
    assert "Nothing to be done" in snakemake(tmp_path, raised, "-n").stdout

    assert planned(tmp_path, raised | {"seed": 1}) == {"prepare_prompts": 1, "write_prompt_shard": 5}
    assert planned(tmp_path, raised | {"shard_size": 40}) == {"prepare_prompts": 1, "write_prompt_shard": 4}


def test_every_job_writes_its_provenance_beside_its_log(tmp_path):
    (tmp_path / "config").symlink_to(REPO / "config")
    snakemake(tmp_path, {"path": "config/demo/sample.jsonl", "num_samples": 20, "shard_size": 10})
    logs = tmp_path / "results" / "p" / "logs"
    records = {
        p.relative_to(logs).as_posix(): json.loads(p.read_text()) for p in logs.rglob("*.provenance.json")
    }
    assert sorted(records) == [
        "prepare_prompts/00000.log.provenance.json",
        "write_prompt_shard/00000.log.provenance.json",
        "write_prompt_shard/00001.log.provenance.json",
    ]
    shard = records["write_prompt_shard/00001.log.provenance.json"]
    assert shard["rule"] == "write_prompt_shard" and shard["wildcards"] == {"shard": "00001"}
    assert shard["packages"]["snakemake"] and shard["packages"]["polars"]
    assert shard["server"] is None  # no server.json among this job's inputs
