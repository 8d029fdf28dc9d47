"""The embedded demo, end to end, in a scratch working directory: every rule from the server snapshot to
the validated checkpoint runs for real (the shared tiny target, real vLLM CPU server), then a second run
does nothing. The run takes the shared demo target (no fit of its own; rule build_demo_target runs in
test_demo_target_rule.py) and extracts through the demo's default, the vllm backend: one extraction
engine serves the main and the baseline shards; the plan from an empty directory still holds every rule.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from support.workflow import failure, scratch_workdir
from support.workflow import workdir_run as _snakemake

from eagle3_pipeline.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def _overrides(port: int) -> dict:
    return {
        "run": "e2e",
        # smaller than the demo default so that the suite fits CI; same code paths
        "demo": {"port": port},
        "dataset": {"num_samples": 96, "shard_size": 32},
        "generation": {"max_tokens": 256},
        "train": {"epochs": 2},
        "validate": {"max_questions": 8, "speedup": False},  # no test here reads the timing
    }


# Fake secrets the demo's unit carries in this run (outside vLLM's flags too), none of which may appear
# in any file the run writes; DEBUG_PASSWORD_CHECKS=1 checks that numbers are never redacted.
SECRETS = ("hf_e2eFakeSecretToken0123456789abcdef", "e2e-key-one-1234", "e2e-key-two-5678",
           "e2eCredentialValue99", "e2eDockerPass77", "e2eCurlPass88")  # fmt: skip
SECRET_LINES = f"""Environment=HF_TOKEN={SECRETS[0]} E2E_API_KEYS={SECRETS[1]},{SECRETS[2]}
Environment=DEBUG_PASSWORD_CHECKS=1
SetCredential=e2e-cred:{SECRETS[3]}
ExecStartPre=-/usr/bin/docker login -u ci -p {SECRETS[4]} registry.invalid
ExecStartPost=-/usr/bin/curl -fsS -u alerts:{SECRETS[5]} http://127.0.0.1:9/started
"""


@pytest.fixture(scope="module")
def demo_workdir(tmp_path_factory) -> Path:
    port = free_port()
    workdir = scratch_workdir(tmp_path_factory.mktemp("demo"), port, unit_lines=SECRET_LINES)
    (workdir / "e2e.yaml").write_text(yaml.safe_dump(_overrides(port)))
    return workdir


@pytest.fixture(scope="module")
def demo_run(demo_workdir: Path) -> subprocess.CompletedProcess:
    result = _snakemake(demo_workdir, "--configfile", "e2e.yaml", "--cores", "2")
    if result.returncode != 0:
        pytest.fail(failure(result, demo_workdir / "results" / "e2e" / "logs"))
    return result


def test_dry_run_plans_everything_from_snapshot_to_checkpoint(tmp_path: Path):
    workdir = scratch_workdir(tmp_path)  # empty: the target is built by the plan too
    (workdir / "e2e.yaml").write_text(yaml.safe_dump(_overrides(free_port())))
    result = _snakemake(workdir, "--configfile", "e2e.yaml", "-n", "--quiet", "rules")
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
    speculators = json.loads((results / "draft" / "speculators" / "config.json").read_text())
    assert speculators["speculators_config"]["verifier"]["name_or_path"].endswith("resources/demo/target")
    assert speculators["norm_before_residual"] is False
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


def test_no_secret_in_any_file_the_run_wrote(demo_run, demo_workdir: Path):
    """Every file of the run (results/ with its logs, work folders and report, resources/ but the
    unit itself, Snakemake's .snakemake/) is free of the unit's secrets; numbers stay numbers."""
    unit = demo_workdir / "resources" / "demo" / "vllm-demo.service"
    assert SECRETS[0] in unit.read_text()  # the run's server did carry them
    files = [
        path for path in demo_workdir.rglob("*")
        if path.is_file() and not path.is_symlink() and path != unit
        and (demo_workdir / "config") not in path.parents
    ]  # fmt: skip
    assert any(p.name == "server.json" for p in files) and any(p.suffix == ".log" for p in files)
    for path in files:
        content = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in content, f"{secret} in {path}"
    server = json.loads((demo_workdir / "results" / "e2e" / "server" / "server.json").read_text())
    assert server["tensor_parallel_size"] == 1 and server["env"]["DEBUG_PASSWORD_CHECKS"] == "<redacted>"


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
    # the stop report is temp (deleted once training is done); the stop job's log keeps its line
    log = (results / "logs" / "stop_extraction_engine" / "hidden_states" / "engine.log").read_text()
    assert re.search(r"extraction engine \S+ (exited|terminated): busy fraction [01]\.\d+", log), log
    assert not (results / "work" / "hidden_states" / "engine" / "stopped.json").exists()
    assert not (results / "work" / "hidden_states" / "engine" / "process.json").exists()
