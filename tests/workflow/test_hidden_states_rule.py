"""Rule extract_hidden_states through Snakemake itself: the launcher command it builds runs (PATH without
the venv, --directory elsewhere), one job writes shard k of both splits with one load of the target,
empty shards are written, and a second run does nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import polars as pl
import pytest
import yaml
from support.hidden_states import trace_rows, write_traces
from support.workflow import run_extraction_rule

from eagle3_pipeline.hidden_states import HiddenStateShard

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return run_extraction_rule(
        workdir,
        [
            f"results/t/hidden_states/{s}/shard-{k:05d}.safetensors"
            for s, k in (("train", 0), ("validation", 1))
        ],
        *args,
    )


def test_rule_runs_the_launcher_and_is_idempotent(hs_target, hs_tokenizer, tmp_path):
    traces = tmp_path / "results" / "t" / "traces" / "shards"
    for split in ("train", "validation"):
        (traces / split).mkdir(parents=True)
    write_traces(traces / "train" / "shard-00000.parquet", trace_rows(hs_tokenizer, 4, shard=0))
    write_traces(traces / "validation" / "shard-00000.parquet", trace_rows(hs_tokenizer, 1, shard=0, start=4))
    for split in ("train", "validation"):  # shard 1: none (the schema, no row)
        empty = write_traces(traces / split / "shard-00001.parquet", trace_rows(hs_tokenizer, 1, shard=1))
        pl.read_parquet(empty).head(0).write_parquet(empty)
    # the server-stopped report the extraction waits for (ancient: its age never reruns a shard)
    (tmp_path / "results" / "t" / "server").mkdir(parents=True)
    (tmp_path / "results" / "t" / "server" / "stopped.json").write_text("{}\n")
    (tmp_path / "config").symlink_to(REPO / "config")
    config = {"run": "t", "demo": {"enabled": False}, "target": {"model": str(hs_target)},
              "hidden_states": {"batch_tokens": 256, "backend": "transformers"}}  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    done = snakemake(tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    out = tmp_path / "results" / "t" / "hidden_states"
    meta = json.loads((out / "train" / "shard-00000.json").read_text())
    assert meta["num_samples"] == 4 and meta["aux_layers_vllm"] == [2, 4, 5]
    assert json.loads((out / "validation" / "shard-00000.json").read_text())["num_samples"] == 1
    assert json.loads((out / "validation" / "shard-00001.json").read_text())["num_samples"] == 0
    log = (tmp_path / "results" / "t" / "logs" / "extract_hidden_states" / "00000.log").read_text()
    assert log.count(f"loading {hs_target}") == 1, log  # both splits of shard 0, one load
    with HiddenStateShard(out / "train" / "shard-00000.safetensors") as shard:
        assert len(shard) == 4
    again = snakemake(tmp_path, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
