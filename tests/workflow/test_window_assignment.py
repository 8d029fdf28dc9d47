"""The windowed DAG (hidden_states.max_disk_gb) follows the plan's seeded windows (for equal shards, each
epoch's order, planning.window_plan.epoch_order, cut into windows of as many as fit): a dry run of the
demo under a cap extracts every shard once per epoch, for the window the order gives it that epoch, and
each window's training job reads exactly its shards' states."""

from __future__ import annotations

from collections import Counter

import yaml
from support.workflow import planned_jobs, write_config

from eagle3_pipeline.planning.window_plan import epoch_order

EPOCHS = 3


def windows_of_two(seed: int, epoch: int, shards: list[str]) -> list[list[str]]:
    """The demo's equal shards two to a window: the epoch's order cut every two shards, each sorted."""
    order = epoch_order(seed, epoch, shards)
    return [sorted(order[i : i + 2]) for i in range(0, len(order), 2)]


def test_each_epoch_plans_every_shard_once_in_the_window_the_function_gives(tmp_path):
    # the demo's shard bound B = 64 x 1024 x 1,033 B = 67.7 MB plus a part being packed (76.2 MB in all);
    # 0.2 GB: windows of 2 of its 4 shards
    config = write_config(
        tmp_path / "capped.yaml",
        run=f"test-{tmp_path.name}",
        hidden_states={"max_disk_gb": 0.2},
        train={"epochs": EPOCHS},
        validate={
            "baseline": False,
            "learning_curve": [],
        },  # the baseline is refused under a cap; the curve: below
    )
    seed = yaml.safe_load(config.read_text())["train"]["seed"]
    jobs, _ = planned_jobs(["--cores", "2", "--configfile", str(config)], "local")
    shards = sorted({job.wildcards.shard for job in jobs if job.rule.name == "extract_hidden_states"})
    assert len(shards) == 4
    expected = [windows_of_two(seed, epoch, shards) for epoch in range(EPOCHS)]
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


def test_a_learning_curve_point_trains_in_the_main_drafts_windows_on_its_own_shards(tmp_path):
    """validate.learning_curve under a cap: the point of 2 of the 4 shards extracts nothing of its own;
    it trains in the windows holding its shards, reading only those, each as often per epoch as without
    a cap (4 entries an epoch: the main draft's steps), and no window is extracted before every draft
    that reads the previous one has trained on it."""
    run = f"test-{tmp_path.name}"
    config = write_config(
        tmp_path / "curve.yaml",
        run=run,
        hidden_states={"max_disk_gb": 0.25},  # the 2-shard windows of 0.2 GB, with the point's state files
        train={"epochs": EPOCHS},
        validate={"baseline": False, "learning_curve": [0.5]},
    )
    seed = yaml.safe_load(config.read_text())["train"]["seed"]
    jobs, _ = planned_jobs(["--cores", "2", "--configfile", str(config)], "local")
    shards = sorted({job.wildcards.shard for job in jobs if job.rule.name == "extract_hidden_states"})
    expected = [windows_of_two(seed, epoch, shards) for epoch in range(EPOCHS)]
    point = "learning_curve/shards-00002/"
    own = set(shards[:2])
    extracted = Counter(job.rule.name for job in jobs)["extract_hidden_states"]
    assert extracted == EPOCHS * len(shards)  # the main draft's extraction alone

    trained = {}  # (variant, epoch, window) -> the train states read
    for job in jobs:
        if job.rule.name == "train_draft_window":
            key = (job.wildcards.variant, int(job.wildcards.epoch), int(job.wildcards.window))
            trained[key] = [str(f) for f in job.input.train_states]
            if job.wildcards.variant == point:
                assert list(job.input.validation_states) == []  # no validation figures, as uncapped
                assert str(job.input.plan[0]) == f"results/{run}/{point}draft/windows/plan.json"
    for e in range(EPOCHS):
        reads = Counter()
        point_windows = sorted(w for v, pe, w in trained if v == point and pe == e)
        holding = [w for w, window in enumerate(expected[e]) if own & set(window)]
        assert len(point_windows) == len(holding)  # one window of its own per window holding its shards
        for mine, shared in zip(point_windows, holding, strict=True):
            files = trained[(point, e, mine)]
            ids = [f.removesuffix(".safetensors").rsplit("-", 1)[1] for f in files]
            assert set(ids) == own & set(expected[e][shared])  # only its shards, only while on disk
            assert all(f.startswith(f"results/{run}/hidden_states/epoch-{e}/train/") for f in files)
            reads.update(ids)
        assert reads == Counter({k: 2 for k in own}), (e, reads)  # 4 entries an epoch, 2 passes each

    for job in jobs:
        if job.rule.name == "extract_hidden_states":
            e = int(job.wildcards.epoch)
            w = next(w for w, window in enumerate(expected[e]) if job.wildcards.shard in window)
            if not e and not w:
                continue
            pe, pw = (e, w - 1) if w else (e - 1, len(expected[e - 1]) - 1)
            gate = sorted(str(f) for f in job.input.after)
            readers = [f"results/{run}/draft/windows/epoch-{pe}/window-{pw}.pt"]
            if own & set(expected[pe][pw]):  # the point read that window too: its state is waited for
                mine = sorted(w for v, ee, w in trained if v == point and ee == pe)
                index = [x for x, window in enumerate(expected[pe]) if own & set(window)].index(pw)
                readers.append(f"results/{run}/{point}draft/windows/epoch-{pe}/window-{mine[index]}.pt")
            assert gate == sorted(readers), (e, w, gate)
    (finish,) = [job for job in jobs if job.rule.name == "train_draft" and job.wildcards.variant == point]
    last = max(w for v, e, w in trained if v == point and e == EPOCHS - 1)
    assert (
        str(finish.input.state) == f"results/{run}/{point}draft/windows/epoch-{EPOCHS - 1}/window-{last}.pt"
    )
