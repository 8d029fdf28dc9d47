"""Rule extract_hidden_states on the vllm backend through Snakemake itself: the engine's interpreter and
settings come from the snapshot (server.json) when hidden_states.vllm leaves them null (not its context:
max_model_len is max_seq_len + 1), one engine runs both splits of the shard as a Snakemake job of its own
(serve_extraction_engine) that Snakemake ends once its extraction jobs are done, a second run does
nothing, and a SIGTERM to snakemake during extraction leaves no engine process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support.hidden_states import trace_rows, write_traces
from support.vllm_server import cpu_vllm_env
from support.workflow import REPO as WORKFLOW_REPO
from support.workflow import extraction_rule_command, run_extraction_rule

from eagle3_pipeline.hidden_states import HiddenStateShard
from eagle3_pipeline.hidden_states.engine import SERVICE_STOP_S

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return run_extraction_rule(
        workdir,
        [f"results/t/hidden_states/{s}/shard-00000.safetensors" for s in ("train", "validation")],
        *args,
    )


def write_inputs(tmp_path: Path, hs_tokenizer, samples: int = 3) -> Path:
    """Shard 0's traces (as rule filter_traces writes them), the server's snapshot and stop report, and
    the config c.yaml: what the extraction rule and its engine job read. Returns results/t."""
    results = tmp_path / "results" / "t"
    traces = results / "traces" / "shards"
    for split in ("train", "validation"):
        (traces / split).mkdir(parents=True)
    write_traces(traces / "train" / "shard-00000.parquet", trace_rows(hs_tokenizer, samples, shard=0))
    write_traces(
        traces / "validation" / "shard-00000.parquet", trace_rows(hs_tokenizer, 1, shard=0, start=samples)
    )
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
    return results


def write_config(tmp_path: Path, target: Path, batch_tokens: int = 256) -> None:
    hidden_states = {"backend": "vllm", "max_seq_len": 400, "batch_tokens": batch_tokens}
    config = {
        "run": "t",
        "demo": {"enabled": False},
        "target": {"model": str(target)},
        "hidden_states": hidden_states,
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))


def test_rule_runs_the_vllm_backend_with_the_snapshots_settings(hs_target, hs_tokenizer, tmp_path):
    results = write_inputs(tmp_path, hs_tokenizer)
    write_config(tmp_path, hs_target)
    plan = snakemake(tmp_path, "-n")
    # the engine is a job of its own that holds the GPU resource; its client holds none
    assert "rule serve_extraction_engine:" in plan.stdout and "gpu=1, extraction_engines=1" in plan.stdout, (
        plan.stdout
    )
    done = snakemake(tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    log = (results / "logs" / "extract_hidden_states" / "00000.log").read_text()
    assert "joined the extraction engine " in log and " started (pid " not in log, log[-4000:]
    engine_log = (results / "logs" / "serve_extraction_engine" / "hidden_states" / "engine.log").read_text()
    assert engine_log.count(" started (pid ") == 1, engine_log[-4000:]
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
    # Snakemake ended the engine job once its client was done: its report says so
    report = json.loads((results / "work" / "hidden_states" / "engine" / "stopped.json").read_text())
    assert report["start_id"] in starts and report["how"] == "ended by Snakemake (SIGTERM)", report
    assert report["tokens"] > 0 and 0 < report["busy_fraction"] <= 1, report
    assert not (results / "work" / "hidden_states" / "engine" / "process.json").exists()
    again = snakemake(tmp_path, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr


def engine_processes(folder: Path) -> list[int]:
    """Every process on this machine running the engine of `folder` (vllm_worker serve FOLDER), read
    from /proc."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = [arg for arg in (proc / "cmdline").read_bytes().split(b"\0") if arg]
        except OSError:
            continue
        # the engine's folder as its job gave it (relative to the workdir)
        named = bool(cmdline) and str(folder).endswith(cmdline[-1].decode(errors="replace"))
        if b"eagle3_pipeline.hidden_states.vllm_worker" in cmdline and named:
            found.append(int(proc.name))
    return found


def test_sigterm_to_snakemake_during_extraction_leaves_no_engine(hs_target, hs_tokenizer, tmp_path):
    """Issue 37: snakemake stopped by SIGTERM while its extraction jobs run: Snakemake lets the running
    jobs finish, ends the engine job, and no engine process (nor one of its session) survives it."""
    # many small batches, so that extraction takes a while (12 samples took 0.1 s on an AMX host)
    results = write_inputs(tmp_path, hs_tokenizer, samples=120)
    write_config(tmp_path, hs_target, batch_tokens=64)
    folder = results / "work" / "hidden_states" / "engine"
    targets = [f"results/t/hidden_states/{s}/shard-00000.safetensors" for s in ("train", "validation")]
    command, env = extraction_rule_command(tmp_path, targets)
    args = [sys.executable, "-m", "snakemake", "--snakefile", str(WORKFLOW_REPO / "Snakefile")]
    process = subprocess.Popen(
        [*args, "--directory", str(tmp_path), *command],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not (folder / "ready.json").exists():  # the engine is up and its client's batches queued
            assert process.poll() is None, process.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "the engine never became ready"
            time.sleep(0.1)
        info = json.loads((folder / "process.json").read_text())
        assert engine_processes(folder) and not list((folder / "done").glob("*.json"))  # mid-extraction
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=600)[0]
    finally:
        if process.poll() is None:
            process.kill()
    assert "Will exit after finishing currently running jobs" in output, output[-4000:]
    assert "Terminating service job" in output, output[-4000:]
    # Snakemake signals the engine job, or (when it exits first: the client may finish as the SIGTERM
    # comes) the job's parent-death signal does; the job stops its engine (at most SERVICE_STOP_S,
    # then the session is killed)
    deadline = time.monotonic() + 2 * SERVICE_STOP_S + 20
    while (engine_processes(folder) or session_alive(int(info["pid"]))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert engine_processes(folder) == [], "an engine process outlived snakemake"
    with pytest.raises(ProcessLookupError):
        os.killpg(int(info["pid"]), 0)  # nothing left of the engine's session (vLLM's processes)


def session_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
