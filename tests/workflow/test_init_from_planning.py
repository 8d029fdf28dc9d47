"""draft.init_from in the plan: the starting draft's files are inputs of training, and one more job
runs the offline check on it for the report."""

from __future__ import annotations

from pathlib import Path

from support.workflow import planned_jobs, write_config


def test_init_from_plans_its_offline_check_and_retrains_on_its_files(tmp_path):
    draft = tmp_path / "public-draft"  # what a dry run needs: the files exist (their content is not read)
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    (draft / "pytorch_model.bin").write_bytes(b"")  # EAGLE's own releases: no model.safetensors
    config = write_config(
        tmp_path / "demo.yaml", run=f"test-{tmp_path.name}", draft={"init_from": str(draft)}
    )
    jobs, _ = planned_jobs(["--configfile", str(config), "--cores", "2"], "local")
    by_rule: dict[str, list] = {}
    for job in jobs:
        by_rule.setdefault(job.rule.name, []).append(job)
    starting = {str(draft / "config.json"), str(draft / "pytorch_model.bin")}
    (check,) = by_rule["validate_offline_init"]
    assert starting <= set(check.input) and str(check.output[0]).endswith("validation/offline_init.json")
    assert len(by_rule["train_draft"]) >= 2  # the main draft and the baseline start from it alike
    for train in by_rule["train_draft"]:
        assert starting <= set(train.input), train.input
        assert train.params.draft["init_from"] == str(draft)
    (plot,) = by_rule["plot_validation"]
    assert any(Path(p).name == "offline_init.json" for p in plot.input)


def test_unset_init_from_changes_no_training_job(tmp_path):
    """Left null, the key is not a param of training (its jobs are those from before it existed) and the
    extra rule is not planned."""
    config = write_config(tmp_path / "demo.yaml", run=f"test-{tmp_path.name}")
    jobs, _ = planned_jobs(["--configfile", str(config), "--cores", "2"], "local")
    assert not any(job.rule.name == "validate_offline_init" for job in jobs)
    for job in jobs:
        if job.rule.name == "train_draft":
            assert "init_from" not in job.params.draft and "init_from" not in dict(job.input.items())
