"""planning.variants: the draft variants the rules plan, from the config alone (no Snakemake)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from eagle3_pipeline.config import check_config, shard_ids
from eagle3_pipeline.planning.variants import (
    BASELINE,
    MAIN,
    Variants,
    curve_points,
    cycled_shards,
    epoch_entries,
    variant_name,
)
from eagle3_pipeline.settings import build_settings

REPO = Path(__file__).resolve().parents[2]
SHARDS = ("00000", "00001", "00002", "00003")


def _variants(points: dict[int, list[float]], baseline: bool = False, num_samples: int = 256) -> Variants:
    return Variants("results/r", SHARDS, num_samples, 64, baseline, points)


def test_the_demo_config_plans_the_main_draft_the_baseline_and_one_point():
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    settings = build_settings(check_config(config, REPO / "config" / "schema.yaml"))
    shards = shard_ids(settings.dataset.num_samples, settings.dataset.shard_size)
    variants = Variants.from_settings(settings, shards, "results/demo")
    assert variants.curve_points == {2: [0.5], 4: [1.0]}  # k = every shard is the main draft itself
    assert variants.curve == {"learning_curve/shards-00002/": 2}
    assert variants.names == [MAIN, BASELINE, "learning_curve/shards-00002/"]


def test_a_point_trains_on_its_first_k_shards_cycled_to_the_main_drafts_entries():
    variants = _variants({1: [0.25], 4: [1.0]})
    point = "learning_curve/shards-00001/"
    assert variants.names == [MAIN, point]  # no baseline
    assert variants.shards_of(point) == ["00000"] and variants.shards_of(MAIN) == list(SHARDS)
    assert variants.train_shards(point) == ["00000"] * 4  # the main draft's 4 entries: its steps
    assert variants.train_shards(MAIN) == list(SHARDS) and variants.train_shards(BASELINE) == list(SHARDS)
    # a last shard under half full is not an entry: 3.4 shards of samples is 3 entries
    assert _variants({1: [0.25]}, num_samples=218).train_shards(point) == ["00000"] * 3


def test_a_point_reads_the_main_drafts_states_and_the_baseline_its_own():
    variants = _variants({2: [0.5]}, baseline=True)
    point = "learning_curve/shards-00002/"
    assert variants.is_point(point) and not variants.is_point(MAIN) and not variants.is_point(BASELINE)
    assert variants.states_of(point) == MAIN and variants.states_of(BASELINE) == BASELINE
    first = "train/shard-00000.json"
    assert variants.export_metadata(point, "epoch-0/") == f"results/r/hidden_states/epoch-0/{first}"
    assert variants.export_metadata(BASELINE, "") == f"results/r/baseline/hidden_states/{first}"


def test_export_ships_the_selected_epoch_or_the_last_one():
    variants = _variants({})
    assert variants.export_weights(MAIN, selected=True) == "results/r/draft/selected/model.safetensors"
    trained = "results/r/baseline/draft/trained/model.safetensors"
    assert variants.export_weights(BASELINE, selected=False) == trained


def test_curve_points_are_nested_shard_counts_and_the_whole_is_the_main_draft():
    assert curve_points([0.25, 0.5, 1.0], 4) == {1: [0.25], 2: [0.5], 4: [1.0]}  # the demo's 4 shards
    assert curve_points([0.25, 0.5, 1.0], 3) == {1: [0.25], 2: [0.5], 3: [1.0]}  # at least the fraction
    assert curve_points([0.1, 0.2, 1.0], 4) == {1: [0.1, 0.2], 4: [1.0]}  # one point for one subset
    assert curve_points([], 4) == {}
    assert variant_name(4, 4) == "" and variant_name(1, 4) == "learning_curve/shards-00001/"
    with pytest.raises(ValueError, match="validate.learning_curve"):
        curve_points([0.0], 4)


def test_a_points_epoch_is_its_shards_cycled_to_the_full_drafts_count():
    shards = ["a", "b", "c", "d"]
    assert cycled_shards(shards, 1) == ["a"] * 4
    assert cycled_shards(shards, 2) == ["a", "b", "a", "b"]
    assert cycled_shards(shards, 3) == ["a", "b", "c", "a"]  # a read twice, b and c once
    assert cycled_shards(shards, 4) == shards  # the main draft's own
    # the full draft's samples in whole shards: 136 samples of shards of 32 (four and a partial 8) fill 4
    assert epoch_entries(136, 32, 1) == 4 and epoch_entries(144, 32, 1) == 5  # half a shard: one more
    assert epoch_entries(152, 32, 2) == 5
    assert cycled_shards(["a", "b", "c", "d", "e"], 1, 4) == ["a"] * 4
    assert epoch_entries(64, 32, 2) == 2
    with pytest.raises(ValueError):
        cycled_shards(shards, 0)
    with pytest.raises(ValueError):
        cycled_shards(shards, 5)
    with pytest.raises(ValueError):
        cycled_shards(shards, 3, 2)  # fewer entries than its shards
