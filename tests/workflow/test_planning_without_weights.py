"""The production example planned where people plan: no target weights, no GPU, no SSH.

The commands run exactly as README.md and docs/cluster.md write them, through bash in a scratch copy of
the repository (its own results/ and .snakemake/), on a machine without /models/Kimi-K2.5 (the example's
target.model): the dry run (with profiles/slurm: tests/workflow/test_profiles.py, the same plan through
the plugin's code), the disk budget and `make cost` plan from the config (target.hidden_size sizes the
disk cap's windows). A real run stops at once at rule require_target_weights, naming the folder;
without target.hidden_size the error names the key and the file looked for. Where the weights are,
nothing of this is planned (tests/workflow/test_planning.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from support.workflow import KIMI_CONFIG, KIMI_TARGET_CONFIG, REPO, job_counts, scratch_checkout, write_config

EXAMPLE = "config/examples/kimi-k2.5-8gpu.yaml"
WEIGHTS = Path("/models/Kimi-K2.5")
DOCUMENTED = "\n".join((REPO / name).read_text() for name in ("README.md", "docs/cluster.md"))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if WEIGHTS.exists():
        pytest.skip(f"{WEIGHTS} exists here: these tests plan where the target's weights are not")
    return scratch_checkout(tmp_path_factory.mktemp("checkout"))


def documented(command: str) -> str:
    assert command in DOCUMENTED, f"not written in README.md or docs/cluster.md: {command}"
    return command


def shell(root: Path, command: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """`command` as a person types it after `source .venv/bin/activate`, in the scratch checkout: from a
    shell, not from inside `make test` (whose MAKELEVEL would make a nested make print its directory)."""
    env = {k: v for k, v in os.environ.items() if k not in {"MAKELEVEL", "MAKEFLAGS", "MFLAGS"}}
    return subprocess.run(
        ["bash", "-c", f"source .venv/bin/activate && {command}"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def output(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr  # Snakemake prints parse errors on stdout


def test_the_production_dry_run_plans_without_the_weights(scratch):
    # the same plan on profiles/slurm, without the weights, is test_profiles.py's (its sbatch lines)
    documented(f"snakemake -n --workflow-profile profiles/slurm --configfile {EXAMPLE}")
    result = shell(scratch, documented(f"snakemake -n --configfile {EXAMPLE}"))
    assert result.returncode == 0, output(result)[-5000:]
    counts = job_counts(result.stdout)
    # the plan of docs/cluster.md: 100 shards, windows of 34 shards (from target.hidden_size 7168), so
    # 3 windows x 10 epochs, each window's engine started once; and the one job standing in for the weights
    assert counts["generate_shard"] == counts["check_disk_budget"] == 100
    assert counts["extract_hidden_states"] == 100 * 10
    assert counts["train_draft_window"] == counts["serve_extraction_engine"] == 3 * 10
    assert counts["require_target_weights"] == 1 and "build_demo_target" not in counts
    assert counts["check_window_plan"] == 1  # the plan checked against the traces before extracting
    assert sum(counts.values()) == 1480
    line = f"the target's weights are not on this machine ({WEIGHTS}/config.json: target.model)"
    assert line in result.stdout  # that job's line in the plan (its message)
    # the jobs that read the target wait on it (its stand-in output), none on the absent file
    assert "results/kimi-k2.5/work/target/config.json.absent" in result.stdout
    assert "MissingInputException" not in output(result) and "gpu-box" not in result.stderr
    assert not WEIGHTS.exists()


def test_the_budget_and_make_cost_plan_from_target_hidden_size(scratch):
    budget = shell(scratch, documented(f"python -m eagle3_pipeline.budget {EXAMPLE}"))
    text = output(budget)
    assert "total: 9.98 TB" in text and "4 states x 7,168 x bfloat16" in text, text
    assert "windows of at most 34 shards" in text and "2 training state files of 16.93 GB" in text
    # exit 1 only when results/ cannot hold the 4.03 TB at once (+5%): the numbers, not a missing file
    fits = "\nfits.\n" in text
    assert budget.returncode == (0 if fits else 1) and (
        fits or "DOES NOT FIT: the hidden states need" in text
    )

    cost = shell(scratch, documented(f"make cost CONFIG={EXAMPLE}"))
    assert cost.returncode == 0, output(cost)
    figures = json.loads(cost.stdout.splitlines()[-1])
    # the bound (every reply max_tokens long) as the workflow plans it from the config, and the plan
    # at the expected length (replies of 3,000 tokens), labelled an estimate: no traces checked here;
    # the corpus and a part for each of the 4 shards packing at once fit the cap: one pass, 1 start
    assert figures["hidden_size"] == 7168 and figures["engine_starts_bound"] == 30
    assert figures["plan_bound"]["window_shards"] == 34 and figures["extraction_passes_bound"] == 10
    assert figures["plan_source"] == "expected" and figures["engine_starts"] == 1
    assert figures["extraction_passes"] == 1 and figures["plan"]["one_pass"]

    # make plan runs the dry run above (its install step a no-op on an installed .venv)
    plan = subprocess.run(
        ["make", "-n", "plan", f"CONFIG={EXAMPLE}"], cwd=scratch, capture_output=True, text=True, check=True
    )
    assert f"snakemake -n --configfile {EXAMPLE}" in plan.stdout
    documented(f"make plan CONFIG={EXAMPLE}")


def test_a_real_run_without_the_weights_stops_at_once_naming_them(scratch):
    # the example on 2 shards (a small DAG), run for real up to the job standing in for the weights
    config = write_config(scratch / "config" / "kimi-small.yaml", KIMI_CONFIG, dataset={"num_samples": 400})
    result = shell(scratch, f"snakemake --cores 1 --configfile {config} --until require_target_weights")
    text = output(result)
    assert result.returncode != 0
    message = f"target.model: {WEIGHTS}/config.json does not exist on this machine"
    assert message in text and "put the weights there (or point target.model at them)" in text
    log = scratch / "results" / "kimi-k2.5" / "logs" / "require_target_weights.log"
    assert message in log.read_text()
    assert not WEIGHTS.exists()  # nothing made where the weights belong


def test_with_the_weights_the_jobs_read_their_config_json(scratch, tmp_path):
    target = tmp_path / "Kimi-K2.5"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(KIMI_TARGET_CONFIG))
    config = write_config(
        tmp_path / "kimi.yaml", KIMI_CONFIG, dataset={"num_samples": 400}, target={"model": str(target)}
    )
    result = shell(scratch, f"snakemake -n --configfile {config}")
    assert result.returncode == 0, output(result)[-5000:]
    assert "require_target_weights" not in job_counts(result.stdout)
    assert f"{target}/config.json" in result.stdout and "config.json.absent" not in result.stdout


def test_without_target_hidden_size_the_error_names_the_key_and_the_file(scratch):
    raw = yaml.safe_load(KIMI_CONFIG.read_text())
    del raw["target"]["hidden_size"]
    (scratch / "config" / "kimi-no-size.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    config = "config/kimi-no-size.yaml"
    missing = f"target.hidden_size is not set and {WEIGHTS}/config.json does not exist"
    for command, needs in (
        (f"snakemake -n --configfile {config}", "hidden_states.max_disk_gb (its training windows)"),
        (f"python -m eagle3_pipeline.budget {config}", "the disk budget"),
        (f"make cost CONFIG={config}", "the extraction cost"),
    ):
        result = shell(scratch, command)
        text = output(result)
        assert result.returncode != 0, text
        assert f"{needs} needs the target's hidden size, but {missing}" in text, text[-3000:]
        assert "set target.hidden_size in the config" in text
    # uncapped, the plan needs no hidden size at all: the dry run plans (2 shards, to keep it short)
    raw["hidden_states"]["max_disk_gb"] = None
    raw["dataset"]["num_samples"] = 400
    (scratch / "config" / "kimi-uncapped.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    result = shell(scratch, "snakemake -n --configfile config/kimi-uncapped.yaml")
    assert result.returncode == 0, output(result)[-5000:]
    counts = job_counts(result.stdout)
    assert counts["extract_hidden_states"] == 2 and counts["require_target_weights"] == 1


def test_lint_is_clean_without_the_weights(scratch):
    # the rule planned where the weights are not is linted too (tests/workflow/test_planning.py lints
    # the demo, whose target its rule builds)
    result = shell(scratch, f"snakemake --lint --configfile {EXAMPLE}")
    assert result.returncode == 0, output(result)[-5000:]
    assert "Congratulations, your workflow is in a good condition!" in output(result)
