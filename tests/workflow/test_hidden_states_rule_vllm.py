"""Rule extract_hidden_states on the vllm backend through Snakemake itself: the engine's interpreter and
settings come from the snapshot (server.json) when hidden_states.vllm leaves them null (not its context:
max_model_len is max_seq_len + 1), one engine runs both splits of the shard and is stopped when
snakemake ends, and a second run does nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from support.hidden_states import trace_rows, write_traces
from support.vllm_server import cpu_vllm_env
from support.workflow import run_extraction_rule

from eagle3_pipeline.hidden_states import HiddenStateShard

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return run_extraction_rule(
        workdir,
        [f"results/t/hidden_states/{s}/shard-00000.safetensors" for s in ("train", "validation")],
        *args,
    )


def test_rule_runs_the_vllm_backend_with_the_snapshots_settings(hs_target, hs_tokenizer, tmp_path):
    results = tmp_path / "results" / "t"
    traces = results / "traces" / "shards"  # shard 0's traces, as rule filter_traces writes them
    for split in ("train", "validation"):
        (traces / split).mkdir(parents=True)
    write_traces(traces / "train" / "shard-00000.parquet", trace_rows(hs_tokenizer, 3, shard=0))
    write_traces(traces / "validation" / "shard-00000.parquet", trace_rows(hs_tokenizer, 1, shard=0, start=3))
    (results / "server").mkdir()
    (results / "server" / "stopped.json").write_text("{}\n")  # the stop report extraction waits for
    snapshot = {  # what snapshot_server writes for the demo unit (the fields the backend reads)
        "python": str(VLLM_PYTHON),
        "tensor_parallel_size": 1,
        "max_model_len": 512,
        "trust_remote_code": False,
        "args": {"--dtype": "bfloat16", "--enforce-eager": True},
        "env": {k: v for k, v in cpu_vllm_env().items() if k.startswith("VLLM_")},
    }
    (results / "server" / "server.json").write_text(json.dumps(snapshot))
    (tmp_path / "config").symlink_to(REPO / "config")
    config = {"run": "t", "demo": {"enabled": False}, "target": {"model": str(hs_target)},
              "hidden_states": {"backend": "vllm", "max_seq_len": 400, "batch_tokens": 256}}  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    done = snakemake(tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    log = (results / "logs" / "extract_hidden_states" / "00000.log").read_text()
    assert log.count("extraction engine ") >= 1 and log.count(" started (pid ") == 1, log[-4000:]
    starts = set()
    for split, count in (("train", 3), ("validation", 1)):
        meta = json.loads((results / "hidden_states" / split / "shard-00000.json").read_text())
        assert meta["backend"] == "vllm" and meta["num_samples"] == count
        engine = meta["engine"]
        # the unit's dtype and eager mode; not its 512-token context: extraction's max_seq_len + 1
        assert (engine["dtype"], engine["enforce_eager"], engine["max_model_len"]) == ("bfloat16", True, 401)
        assert engine["runner"] == "v1" and engine["connector"] == "SyncHiddenStatesConnector"
        starts.add(engine["start_id"])
        with HiddenStateShard(results / "hidden_states" / split / "shard-00000.safetensors") as shard:
            assert len(shard) == count and shard.metadata["aux_layers_vllm"] == [2, 4, 5]
    assert len(starts) == 1  # both splits, one engine
    # the workflow's onsuccess handler stopped the engine: none outlives the snakemake call
    assert not (results / "work" / "hidden_states" / "engine" / "process.json").exists()
    again = snakemake(tmp_path, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
