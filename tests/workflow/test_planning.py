"""Planning: dry runs of the demo and the production example, and the linter, through the real CLI.

Parse time must stay cheap and side-effect free: the Kimi example names an SSH host that does not
exist here, so a dry run that tried SSH, HTTP or the hub at parse time would fail or hang.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml
from support.traces import checked_traces
from support.workflow import (
    DEMO_CONFIG,
    KIMI_CONFIG,
    REPO,
    dry_run,
    job_counts,
    planned_jobs,
    planning_workdir,
    scratch_workdir,
    snakemake,
    write_config,
)

PIPELINE_RULES = {
    "snapshot_server",
    "prepare_prompts",
    "write_prompt_shard",
    "preflight_generation",
    "generate_shard",
    "stop_server",
    "filter_traces",
    "merge_traces",
    "split_traces",
    "check_disk_budget",
    "extract_hidden_states",
    "vocab_map",
    "train_draft",
    "export_draft",
    "validate_offline",
    "serve_check",
    "all",
}


def test_demo_dry_run_plans_every_stage(tmp_path):
    config = write_config(tmp_path / "demo.yaml", run=f"test-{tmp_path.name}")
    counts = job_counts(dry_run(config).stdout)
    assert set(counts) >= PIPELINE_RULES, f"missing from the plan: {PIPELINE_RULES - set(counts)}"
    shards = 256 // 64
    assert counts["generate_shard"] == counts["write_prompt_shard"] == shards
    assert counts["preflight_generation"] == 1  # once per run, not per shard
    assert counts["extract_hidden_states"] == shards  # one job writes both splits of a shard
    assert counts["filter_traces"] == counts["check_disk_budget"] == shards  # per shard: no barrier
    assert counts["serve_extraction_engine"] == 1  # one engine job for the main shards of the run
    assert counts["baseline_serve_extraction_engine"] == 1  # one for the baseline's, after the main's
    assert "require_target_weights" not in counts  # the demo's target is built by its rule


def test_kimi_example_plans_without_ssh_or_network(tmp_path, kimi_target):
    # the example on 4 shards under a 2-shard cap (its rules and windows, a DAG 25 times smaller): the
    # whole example's plan is counted where the weights are not (test_planning_without_weights.py) and
    # on profiles/slurm (test_profiles.py)
    config = write_config(
        tmp_path / "kimi.yaml",
        KIMI_CONFIG,
        run=f"test-{tmp_path.name}",
        target={"model": str(kimi_target)},
        dataset={"num_samples": 800},
        hidden_states={"max_disk_gb": 300},
    )
    result = dry_run(config)
    counts = job_counts(result.stdout)
    assert set(counts) >= PIPELINE_RULES
    assert "build_demo_target" not in counts  # demo disabled
    # the weights' config.json is here: the jobs read it (tests/workflow/test_planning_without_weights.py)
    assert "require_target_weights" not in counts
    # shards of 117 GB at the bound (200 x 10,240 tokens x 57 KB): windows of 2 shards, every shard
    # extracted once per epoch
    assert counts["generate_shard"] == 4 and counts["extract_hidden_states"] == 4 * 10
    assert counts["train_draft_window"] == 10 * 2 and counts["train_draft"] == 1
    assert counts["serve_extraction_engine"] == 10 * 2  # one engine per epoch and window, not per shard
    assert "gpu-box" not in result.stderr  # nothing tried to reach the host


def test_a_disk_cap_plans_windows_per_epoch(tmp_path):
    # the demo's shard bound B = 64 x 1024 x 1,033 B = 67.7 MB, plus a part of 8,192 tokens being packed:
    # 76.2 MB; 0.2 GB less two training state files of 6.3 MB: windows of 2 shards
    config = write_config(
        tmp_path / "capped.yaml",
        run=f"test-{tmp_path.name}",
        hidden_states={"max_disk_gb": 0.2},
        train={"epochs": 3},
        validate={"baseline": False, "learning_curve": []},  # the baseline is refused under a cap
    )
    counts = job_counts(dry_run(config).stdout)
    assert counts["extract_hidden_states"] == 4 * 3  # every shard, every epoch
    assert counts["train_draft_window"] == 2 * 3 and counts["plan_windows"] == counts["train_draft"] == 1
    assert counts["check_disk_budget"] == 4  # once per shard, not per epoch
    assert counts["serve_extraction_engine"] == 2 * 3  # an engine per window and epoch


def test_a_cap_that_holds_every_shard_plans_one_extraction_pass(tmp_path):
    # 4 shards of 76.2 MB each (a shard once plus a part being packed) and two training state files of
    # 6.3 MB fit 1 GB at once: extracted once and kept for every epoch, as uncapped (issue 37, item 2)
    config = write_config(
        tmp_path / "holds.yaml",
        run=f"test-{tmp_path.name}",
        hidden_states={"max_disk_gb": 1.0},
        train={"epochs": 3},
        validate={"baseline": False, "learning_curve": []},
    )
    counts = job_counts(dry_run(config).stdout)
    assert counts["extract_hidden_states"] == 4  # every shard once, not once per epoch
    assert counts["serve_extraction_engine"] == 1  # one engine start
    assert counts["train_draft"] == 1 and "train_draft_window" not in counts and "plan_windows" not in counts
    assert counts["check_window_plan"] == 1  # the plan checked against the traces before extracting


def _checked_traces(workdir: Path, run: str, shards: int, total_bytes: int) -> None:
    """support.traces.checked_traces with the demo target's record: `total_bytes` a shard."""
    hidden_states = yaml.safe_load(DEMO_CONFIG.read_text())["hidden_states"]
    made = {"hidden_size": 128, "dtype": "bfloat16"}  # the demo target's
    made |= {key: hidden_states[key] for key in ("max_seq_len", "overlong")}
    checked_traces(workdir / "results" / run, shards, {"total_bytes": total_bytes, **made})


def test_the_checked_traces_size_the_plan(tmp_path):
    # 0.2 GB holds 2 shards at their bound (76.2 MB each): windows. Once every shard's traces are checked
    # at 20 MB of states (28.5 MB with a part), all 4 fit at once: the next dry run plans one pass
    (tmp_path / "work").mkdir()
    workdir = scratch_workdir(tmp_path / "work")
    run = f"test-{tmp_path.name}"
    config = write_config(
        tmp_path / "capped.yaml",
        run=run,
        hidden_states={"max_disk_gb": 0.2},
        train={"epochs": 3},
        validate={"baseline": False, "learning_curve": []},
    )
    before = job_counts(dry_run(config, workdir=workdir).stdout)
    assert before["extract_hidden_states"] == 4 * 3 and before["serve_extraction_engine"] == 2 * 3
    _checked_traces(workdir, run, 4, 20_000_000)
    after = job_counts(dry_run(config, workdir=workdir).stdout)
    assert after["extract_hidden_states"] == 4 and after["serve_extraction_engine"] == 1
    assert after["train_draft"] == 1 and "train_draft_window" not in after
    _checked_traces(workdir, run, 4, 60_000_000)  # longer replies (68.5 MB with a part): windows of 2
    again = job_counts(dry_run(config, workdir=workdir).stdout)
    assert again["extract_hidden_states"] == 4 * 3 and again["train_draft_window"] == 2 * 3


def _checkout_state() -> dict[str, int]:
    """Every file under the checkout's results/ and .snakemake/, with its modification time."""
    folders = (REPO / "results", REPO / ".snakemake")
    return {str(p): p.lstat().st_mtime_ns for folder in folders if folder.exists() for p in folder.rglob("*")}


def test_a_plan_neither_reads_nor_writes_the_checkout(tmp_path):
    # `make test` after `make demo` in the same checkout: what a run left under the checkout's results/
    # changes no test's plan, and no test's plan writes there (the engine's service file is made when
    # Snakemake plans). Planted in the checkout: checked traces small enough for one extraction pass
    # (test_the_checked_traces_size_the_plan), under a run name no one else uses, removed after
    run = f"test-{tmp_path.name}"
    config = write_config(
        tmp_path / "capped.yaml",
        run=run,
        hidden_states={"max_disk_gb": 0.2},
        train={"epochs": 3},
        validate={"baseline": False, "learning_curve": []},
    )
    planted = REPO / "results" / run
    results_existed = (REPO / "results").exists()
    try:
        _checked_traces(REPO, run, 4, 20_000_000)
        before = _checkout_state()
        counts = job_counts(dry_run(config).stdout)
        jobs, _ = planned_jobs(["--cores", "2", "--configfile", str(config)], "local")
        assert _checkout_state() == before  # nothing written: no service file, no .snakemake/
    finally:
        shutil.rmtree(planted, ignore_errors=True)
        if not results_existed:
            shutil.rmtree(REPO / "results", ignore_errors=True)
    # the plan of a run with no checked traces: windows of 2 shards, every shard extracted every epoch
    assert counts["extract_hidden_states"] == 4 * 3 and counts["serve_extraction_engine"] == 2 * 3
    assert sum(job.rule.name == "extract_hidden_states" for job in jobs) == 4 * 3


def test_a_disk_cap_below_one_shard_is_refused_when_parsed(tmp_path):
    config = write_config(tmp_path / "tiny.yaml", run="t", hidden_states={"max_disk_gb": 0.05})
    result = snakemake("-n", "--configfile", str(config))
    output = result.stdout + result.stderr  # Snakemake prints the parse error on stdout
    assert result.returncode != 0
    assert "max_disk_gb: 0.05 GB (50.00 MB) cannot hold one shard's hidden states" in output
    # 67.70 MB once, plus a part of 8,192 tokens being packed (76.16 MB), + 4 state files of 6.31 MB:
    # 2 for the main draft, 2 for the demo's learning-curve point, which trains beside it
    assert "67.70 MB" in output and "76.16 MB" in output and "at least 0.102" in output
    assert "4 training state files of 6.31 MB (2 for each of 2 drafts" in output
    baseline = write_config(tmp_path / "b.yaml", run="t", hidden_states={"max_disk_gb": 1.0})
    refused = snakemake("-n", "--configfile", str(baseline))
    assert refused.returncode != 0 and "set validate.baseline: false" in refused.stdout + refused.stderr
    curve = write_config(tmp_path / "lc.yaml", run="t", hidden_states={"max_disk_gb": 1.0},
                         validate={"baseline": False})  # fmt: skip
    planned = snakemake("-n", "--configfile", str(curve))  # the demo's learning curve, under a cap
    assert planned.returncode == 0, planned.stdout[-2000:] + planned.stderr[-2000:]
    assert re.search(r"^learning_curve\s+1$", planned.stdout, re.MULTILINE), planned.stdout[-2000:]


def test_lint_is_clean():
    result = snakemake("--lint")  # exits 1 whenever it prints a lint
    output = result.stderr + result.stdout
    titles = set(re.findall(r"^\s+\* (.+?):$", output, flags=re.MULTILINE))
    assert result.returncode == 0 and not titles, output[-5000:]
    assert "Congratulations, your workflow is in a good condition!" in output


def test_the_baseline_is_the_draft_rules_variant_and_its_serve_check_stands_alone():
    jobs, _ = planned_jobs(["--cores", "2"], "local")
    checks = {job.wildcards.variant: job for job in jobs if job.rule.name == "serve_check"}
    assert set(checks) == {"", "baseline/"}
    main, baseline = checks[""], checks["baseline/"]
    assert str(baseline.output[0]) == "results/demo/baseline/validation/serve_check.json"
    assert str(main.output[0]) == "results/demo/validation/serve_check.json"  # the main paths as ever
    # its own vLLM log and pid file (work folder) and a file as its log
    assert (main.params.work, baseline.params.work) == (
        "results/demo/work/serve_check",
        "results/demo/work/baseline/serve_check",
    )
    assert list(map(str, baseline.log)) == ["results/demo/logs/baseline/serve_check.log"]
    # never two draft servers at once, yet neither check waits on (or fails with) the other
    assert not set(map(str, main.output)) & set(map(str, baseline.input))
    assert not set(map(str, baseline.output)) & set(map(str, main.input))
    assert main.resources["draft_server"] == baseline.resources["draft_server"] == 1
    assert main.dag.workflow.global_resources["draft_server"] == 1
    # the same rules: no second chain of baseline_* rules beyond its traces, their extraction and its
    # extraction engine's job (a scope of its own: the main draft never waits on the baseline)
    names = {job.rule.name for job in jobs}
    assert {name for name in names if name.startswith("baseline")} == {
        "baseline_traces",
        "baseline_extract_hidden_states",
        "baseline_serve_extraction_engine",
    }


def _engine_interpreters(methods: set[Any]) -> set[str]:
    """The interpreter the engine rules' shell commands exec, the workflow parsed under `methods`."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.enums import Quietness
    from snakemake.settings.types import ConfigSettings, DeploymentSettings, OutputSettings, ResourceSettings

    with planning_workdir() as workdir, SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        workflow = api.workflow(
            resource_settings=ResourceSettings(cores=1),
            config_settings=ConfigSettings(configfiles=[DEMO_CONFIG]),
            deployment_settings=DeploymentSettings(deployment_method=methods),
            snakefile=REPO / "Snakefile",
            workdir=workdir,
        )._workflow
        return {
            str(workflow.get_rule(name).params.python)
            for name in ("serve_extraction_engine", "baseline_serve_extraction_engine")
        }


def test_the_engine_job_runs_the_interpreter_of_its_own_environment():
    from snakemake_interface_executor_plugins.settings import DeploymentMethod

    # --use-conda: the conda environment's python on the job's PATH, as Snakemake runs a script:
    assert _engine_interpreters({DeploymentMethod.CONDA}) == {"python"}
    assert _engine_interpreters(set()) == {sys.executable}  # else the one that reads the Snakefile
