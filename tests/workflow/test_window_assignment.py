"""The windowed DAG (hidden_states.max_disk_gb) follows budget.epoch_windows: a dry run of the demo
under a cap extracts every shard once per epoch, for the window the function gives it that epoch, and
each window's training job reads exactly its shards' states."""

from __future__ import annotations

from collections import Counter

import yaml
from support.workflow import planned_jobs, write_config

from eagle3_pipeline.budget import epoch_windows

EPOCHS = 3


def test_each_epoch_plans_every_shard_once_in_the_window_the_function_gives(tmp_path):
    # the demo's shard bound B = 64 x 1024 x 1,033 B = 67.7 MB plus a part being packed (76.2 MB in all);
    # 0.2 GB: windows of 2 of its 4 shards
    config = write_config(
        tmp_path / "capped.yaml",
        run=f"test-{tmp_path.name}",
        hidden_states={"max_disk_gb": 0.2},
        train={"epochs": EPOCHS},
        validate={"baseline": False, "learning_curve": []},  # neither is trained under a cap
    )
    seed = yaml.safe_load(config.read_text())["train"]["seed"]
    jobs, _ = planned_jobs(["--cores", "2", "--configfile", str(config)], "local")
    shards = sorted({job.wildcards.shard for job in jobs if job.rule.name == "extract_hidden_states"})
    assert len(shards) == 4
    expected = [epoch_windows(seed, epoch, shards, 2) for epoch in range(EPOCHS)]
    assert len({str(epoch) for epoch in expected}) > 1  # the assignment changes between epochs here
    (plan,) = [job for job in jobs if job.rule.name == "plan_windows"]
    assert plan.params.windows == expected  # recorded in draft/windows/plan.json

    extractions = [job for job in jobs if job.rule.name == "extract_hidden_states"]
    extracted = Counter((int(job.wildcards.epoch), job.wildcards.shard) for job in extractions)
    assert extracted == Counter((e, k) for e in range(EPOCHS) for k in shards)  # each shard once per epoch
    for job in jobs:
        if job.rule.name == "extract_hidden_states":  # waits for the state before its window
            e = int(job.wildcards.epoch)
            w = next(w for w, window in enumerate(expected[e]) if job.wildcards.shard in window)
            # the very first window waits for the plan's check against the traces (check_window_plan)
            previous = f"epoch-{e}/window-{w - 1}.pt" if w else (f"epoch-{e - 1}/window-1.pt" if e else None)
            gate = [str(f) for f in job.input.after]
            first = f"results/test-{tmp_path.name}/budget/window_plan.json"
            assert gate == [first] if previous is None else gate[0].endswith(previous), (e, w, gate)
        if job.rule.name == "train_draft_window":
            e, w = int(job.wildcards.epoch), int(job.wildcards.window)
            for split in ("train", "validation"):
                files = [str(f) for f in job.input[f"{split}_states"]]
                assert files == [
                    f"results/test-{tmp_path.name}/hidden_states/epoch-{e}/{split}/shard-{k}.safetensors"
                    for k in expected[e][w]
                ], (e, w, split)
            assert job.params.runtime.section("window")["shards"] == expected[e][w]  # the job's check
