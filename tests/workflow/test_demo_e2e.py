"""The embedded demo, end to end, in a scratch working directory: every rule from the server snapshot to
the validated checkpoint runs for real (tiny target, real vLLM CPU server), then a second run does nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def _snakemake(workdir: Path, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    command = [*SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir), *args]
    return subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def demo_workdir(tmp_path_factory) -> Path:
    if not (ROOT / ".venv-vllm" / "bin" / "python").exists():
        pytest.skip("the demo vLLM server needs .venv-vllm: run `make install`")
    workdir = tmp_path_factory.mktemp("demo")
    (workdir / "config").symlink_to(ROOT / "config")
    overrides = {
        "run": "e2e",
        # smaller than the demo default so that the suite fits CI; same code paths
        "demo": {"port": 18611},
        "dataset": {"num_samples": 96, "shard_size": 32},
        "generation": {"max_tokens": 256},
        "train": {"epochs": 2},
        "validate": {"max_questions": 8},
    }
    (workdir / "e2e.yaml").write_text(yaml.safe_dump(overrides))
    return workdir


@pytest.fixture(scope="module")
def demo_run(demo_workdir: Path) -> subprocess.CompletedProcess:
    result = _snakemake(demo_workdir, "--configfile", "e2e.yaml", "--cores", "2")
    if result.returncode != 0:
        logs = sorted((demo_workdir / "results" / "e2e" / "logs").rglob("*.log"))
        tails = "\n".join(f"== {p}\n{p.read_text()[-3000:]}" for p in logs)
        pytest.fail(f"demo run failed:\n{result.stderr[-6000:]}\n{tails}")
    return result


def test_dry_run_plans_everything_from_snapshot_to_checkpoint(demo_workdir: Path):
    result = _snakemake(demo_workdir, "--configfile", "e2e.yaml", "-n", "--quiet", "rules")
    assert result.returncode == 0, result.stderr
    for rule in [
        "build_demo_target",
        "snapshot_server",
        "prepare_prompts",
        "write_prompt_shard",
        "generate_shard",
        "stop_server",
        "merge_traces",
        "split_traces",
        "extract_hidden_states",
        "vocab_map",
        "train_draft",
        "export_draft",
        "validate_offline",
        "serve_check",
    ]:
        assert rule in result.stdout, f"{rule} missing from the plan:\n{result.stdout}"


def test_demo_produces_validated_checkpoint(demo_run, demo_workdir: Path):
    results = demo_workdir / "results" / "e2e"
    server = json.loads((results / "server" / "server.json").read_text())
    assert server["reasoning_parser"] == "kimi_k2"
    stats = json.loads((results / "traces" / "stats.json").read_text())
    assert json.dumps(stats)  # accounted and written
    config = json.loads((results / "draft" / "checkpoint" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    offline = json.loads((results / "validation" / "offline.json").read_text())
    assert offline
    serve = json.loads((results / "validation" / "serve_check.json").read_text())
    assert serve


def test_demo_traces_carry_thinking_and_answer(demo_run, demo_workdir: Path):
    import polars as pl

    traces = pl.read_parquet(demo_workdir / "results" / "e2e" / "traces" / "traces.parquet")
    assert traces.height > 0
    with_both = traces.filter(
        (pl.col("reasoning").str.len_chars() > 0) & (pl.col("content").str.len_chars() > 0)
    )
    assert with_both.height >= traces.height // 2, "most demo traces should have thinking and an answer"


def test_second_run_has_nothing_to_do(demo_run, demo_workdir: Path):
    result = _snakemake(demo_workdir, "--configfile", "e2e.yaml", "--cores", "2")
    assert result.returncode == 0, result.stderr
    assert "Nothing to be done" in result.stdout + result.stderr


def test_no_server_left_running(demo_run, demo_workdir: Path):
    pid_files = list((demo_workdir / "results" / "e2e" / "work").rglob("*.pid"))
    for pid_file in pid_files:
        pid = int(pid_file.read_text().split()[0])
        assert not Path(f"/proc/{pid}").exists(), f"server {pid} ({pid_file}) still running"


def test_one_extraction_engine_served_every_shard_and_was_stopped(demo_run, demo_workdir: Path):
    """Issue 22: the main and baseline shards' states come from at most 2 engine starts (one per run,
    unless its idle timeout ran out between them), and the engine is stopped before training."""
    results = demo_workdir / "results" / "e2e"
    metadata = [
        *(results / "hidden_states").rglob("shard-*.json"),
        *(results / "baseline").rglob("shard-*.json"),
    ]
    engines = [json.loads(path.read_text())["engine"] for path in metadata if "hidden_states" in str(path)]
    assert len(engines) >= 8  # 4 shards x 2 splits, and the baseline's
    assert len({engine["start_id"] for engine in engines}) <= 2, {e["start_id"] for e in engines}
    stopped = json.loads((results / "work" / "hidden_states" / "engine" / "stopped.json").read_text())
    assert stopped["stopped"] in ("exited", "terminated") and stopped["busy_fraction"] is not None
    assert not (results / "work" / "hidden_states" / "engine" / "process.json").exists()
