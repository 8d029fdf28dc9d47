"""The learning curve and the selection by acceptance, planned by Snakemake itself (dry-run DAGs of the
demo config): each point is the draft rules' {variant} on the main draft's states (training and
selection jobs, nothing extracted, exported or served again), and a point whose shards a new shard leaves as
they were keeps its training job as it was (the same inputs and params: nothing for Snakemake to rerun),
only its measurement on the grown validation set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.workflow import planned_jobs, write_config

# with selection (the demo's), a point's acceptance is its chosen epoch's in selection.json: no export
POINT_RULES = {"vocab_map", "train_draft", "select_checkpoint"}


def _jobs(tmp_path: Path, num_samples: int) -> list[Any]:
    config = write_config(
        tmp_path / f"c{num_samples}.yaml",
        run="curve-plan",
        dataset={"num_samples": num_samples},
        validate={"learning_curve": [0.25, 0.5, 1.0]},
    )
    jobs, _ = planned_jobs(["--cores", "2", "--configfile", str(config)], "local")
    return jobs


def _by_variant(jobs: list[Any]) -> dict[str, dict[str, Any]]:
    variants: dict[str, dict[str, Any]] = {}
    for job in jobs:
        variant = job.wildcards.get("variant")
        if variant is not None:
            variants.setdefault(variant, {})[job.rule.name] = job
    return variants


def test_each_point_plans_training_and_validation_only_and_a_new_shard_retrains_no_kept_point(tmp_path):
    four = _jobs(tmp_path, 256)  # the demo: 4 shards of 64 -> points of 1, 2 and 4 (the main draft) shards
    variants = _by_variant(four)
    points = sorted(v for v in variants if v.startswith("learning_curve/"))
    assert points == ["learning_curve/shards-00001/", "learning_curve/shards-00002/"]
    for variant in points:
        assert set(variants[variant]) == POINT_RULES, variant  # no extraction, export or serve check
        train = variants[variant]["train_draft"]
        shards = [Path(f).name for f in train.input.train_states]
        assert shards == [f"shard-{k:05d}.safetensors" for k in range(int(variant[-3:-1]))]
        assert all("/results/curve-plan/hidden_states/train/" in f"/{f}" for f in train.input.train_states)
        assert train.resources["gpu"] == 1
        # never beside an extraction engine: after the baseline's engine, the last to run, has stopped
        assert any("baseline/hidden_states/engine/stopped.json" in str(f) for f in train.input.engine_stopped)
    curve = next(job for job in four if job.rule.name == "learning_curve")
    assert {Path(f).parts[-3] for f in curve.input if f.endswith("selection.json")} == {
        "shards-00001",
        "shards-00002",
        "curve-plan",
    }
    report = next(job for job in four if job.rule.name == "plot_validation")
    assert {"selection", "learning_curve"} <= set(report.output.keys())

    # a fifth shard: points of 2 (kept), 3 (new) and 5 shards
    five = _by_variant(_jobs(tmp_path, 320))
    assert sorted(v for v in five if v.startswith("learning_curve/")) == [
        "learning_curve/shards-00002/",
        "learning_curve/shards-00003/",
    ]
    before, after = variants["learning_curve/shards-00002/"], five["learning_curve/shards-00002/"]
    for rule in ("vocab_map", "train_draft"):  # the same files in, the same params: not rerun
        assert list(map(str, after[rule].input)) == list(map(str, before[rule].input)), rule
        assert after[rule].params == before[rule].params, rule
    grown = set(map(str, after["select_checkpoint"].input)) - set(map(str, before["select_checkpoint"].input))
    assert grown == {"results/curve-plan/hidden_states/validation/shard-00004.safetensors"}
