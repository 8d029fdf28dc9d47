"""The Kimi-family demo's DAG (`make demo DEMO=kimi`: config/demo-kimi/config.yaml over the default
config), planned in a scratch checkout without its target: every stage to a served MLA draft, the
baseline, and the Llama draft of the head-to-head trained, selected, exported and measured by the main
draft's own rules, the comparison in rule all (the default config, the Llama demo, plans none of them:
tests/workflow/test_planning.py's counts). The run itself: docs/demo.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.workflow import dry_run, job_counts, scratch_checkout, snakemake

KIMI_DEMO = "config/demo-kimi/config.yaml"
HEAD_TO_HEAD = (
    "head_to_head_train_llama",
    "head_to_head_select_llama",
    "head_to_head_export_llama",
    "head_to_head_validate_llama",
    "head_to_head",
)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scratch_checkout(tmp_path_factory.mktemp("checkout"))


def test_kimi_demo_plans_every_stage_and_the_head_to_head(checkout: Path) -> None:
    counts = job_counts(dry_run(checkout / KIMI_DEMO, cwd=checkout).stdout)
    assert counts["build_demo_target"] == 1, counts
    assert counts["generate_shard"] == counts["extract_hidden_states"] == 4  # 128 prompts, shards of 32
    assert counts["train_draft"] == counts["serve_check"] == 2  # the MLA draft and its baseline
    assert all(counts[rule] == 1 for rule in HEAD_TO_HEAD), counts
    # the comparison's page in the report, written by rule head_to_head beside its JSON
    page = snakemake(
        "-n", "results/demo-kimi/report/head_to_head.html", "--configfile", KIMI_DEMO, cwd=checkout
    )
    assert page.returncode == 0 and "rule head_to_head:" in page.stdout, (
        page.stdout[-3000:] + page.stderr[-3000:]
    )


def test_kimi_demo_builds_its_own_target_and_unit_beside_the_llama_demo(checkout: Path) -> None:
    result = snakemake(
        "-n", "resources/demo-kimi/vllm-demo-kimi.service", "--configfile", KIMI_DEMO, cwd=checkout
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "resources/demo-kimi/target/config.json" in result.stdout
    assert "resources/demo/" not in result.stdout  # the Llama demo's target is left as it is
