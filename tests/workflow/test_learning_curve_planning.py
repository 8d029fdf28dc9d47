"""The learning curve and the selection by acceptance, planned by Snakemake itself (dry-run DAGs of the
demo config): each point is the draft rules' {variant} on the main draft's states (training, selection,
export and offline validation jobs; nothing extracted or served again), trained at the main draft's
optimizer steps (its k shards cycled to the main draft's N per epoch, the same epochs), so a new shard,
which changes N, retrains every point."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.workflow import planned_jobs, write_config

# a point's acceptance is its chosen epoch's export measured offline (offline.json: the per-question
# replays its gains are paired on), as the main draft's; no extraction, no serve check
POINT_RULES = {"vocab_map", "train_draft", "select_checkpoint", "export_draft", "validate_offline"}


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


def _names(files: Any) -> list[str]:
    return [Path(f).name for f in files]


def test_each_point_trains_the_main_drafts_steps_on_its_own_shards_and_a_new_shard_retrains_every_point(
    tmp_path,
):
    four = _jobs(tmp_path, 256)  # the demo: 4 shards of 64 -> points of 1, 2 and 4 (the main draft) shards
    variants = _by_variant(four)
    points = sorted(v for v in variants if v.startswith("learning_curve/"))
    assert points == ["learning_curve/shards-00001/", "learning_curve/shards-00002/"]
    main = variants[""]["train_draft"]
    for variant in points:
        assert set(variants[variant]) == POINT_RULES, variant  # no extraction, no serve check
        k = int(variant[-3:-1])
        train = variants[variant]["train_draft"]
        # one epoch: its k shards cycled to the main draft's 4, the main draft's epochs and schedule
        assert _names(train.input.train_states) == [f"shard-{i % k:05d}.safetensors" for i in range(4)]
        assert all("/results/curve-plan/hidden_states/train/" in f"/{f}" for f in train.input.train_states)
        assert train.params.train == main.params.train and train.params.get(
            "checkpoint_epochs"
        ) == main.params.get("checkpoint_epochs")
        assert list(train.output.checkpoints) == [
            f.replace("results/curve-plan/draft/", f"results/curve-plan/{variant}draft/")
            for f in main.output.checkpoints
        ]
        assert not train.input.validation_states  # no validation figures while it trains
        # the vocabulary from its own k shards, once each
        assert _names(variants[variant]["vocab_map"].input.metadata) == [
            f"shard-{i:05d}.json" for i in range(k)
        ]
        assert train.resources["gpu"] == 1
        # never beside an extraction engine: every engine job (rule serve_extraction_engine) holds every
        # GPU of the run, so Snakemake's gpu resource keeps this job's one apart from it
        engines = [job for job in four if job.rule.name.endswith("serve_extraction_engine")]
        assert engines and all(job.resources["gpu"] >= train.resources["gpu"] for job in engines)
        # measured on the main draft's validation states, as the main draft
        assert list(variants[variant]["validate_offline"].input.states) == list(
            variants[""]["validate_offline"].input.states
        )
    curve = next(job for job in four if job.rule.name == "learning_curve")
    for kind in ("offline", "selection", "history"):
        folders = {part for f in curve.input if f.endswith(f"/{kind}.json") for part in Path(f).parts}
        assert {"shards-00001", "shards-00002"} <= folders, kind
    assert curve.input.full_history == "results/curve-plan/draft/trained/history.json"
    assert _names(curve.input.metadata) == [f"shard-{i:05d}.json" for i in range(4)]
    assert curve.params.epochs == main.params.train["epochs"] and curve.params.entries == 4
    report = next(job for job in four if job.rule.name == "plot_validation")
    assert {"selection", "learning_curve"} <= set(report.output.keys())

    # a fifth shard: points of 2 and 3 shards and the main draft's 5
    five = _by_variant(_jobs(tmp_path, 320))
    assert sorted(v for v in five if v.startswith("learning_curve/")) == [
        "learning_curve/shards-00002/",
        "learning_curve/shards-00003/",
    ]
    before, after = variants["learning_curve/shards-00002/"], five["learning_curve/shards-00002/"]
    # its vocabulary is its own shards' (kept); its training reads them for the main draft's 5 (rerun)
    assert list(map(str, after["vocab_map"].input)) == list(map(str, before["vocab_map"].input))
    assert _names(after["train_draft"].input.train_states) == [
        f"shard-{i % 2:05d}.safetensors" for i in range(5)
    ]
    assert list(map(str, after["train_draft"].input)) != list(map(str, before["train_draft"].input))
    # 3 of 5 shards: shards 0 and 1 read twice an epoch, shard 2 once
    assert _names(five["learning_curve/shards-00003/"]["train_draft"].input.train_states) == [
        f"shard-{i:05d}.safetensors" for i in (0, 1, 2, 0, 1)
    ]
