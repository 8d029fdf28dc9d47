"""planning.windows: training in plan windows under a disk cap, as paths (no Snakemake)."""

from __future__ import annotations

from eagle3_pipeline.planning.variants import MAIN, Variants, cycled_shards
from eagle3_pipeline.planning.windows import DraftWindows, TrainingWindows, point_windows, training_state

SHARDS = ("a", "b", "c", "d")
# two epochs of two plan windows each, grouped anew per epoch
WINDOWS = [[["a", "c"], ["b", "d"]], [["c", "d"], ["a", "b"]]]
POINT = "learning_curve/shards-00002/"


def _training() -> TrainingWindows:
    variants = Variants("results/r", SHARDS, 256, 64, False, {2: [0.5], 4: [1.0]})
    return TrainingWindows.plan("results/r", WINDOWS, variants)


def test_the_main_draft_trains_in_every_plan_window_and_a_point_in_those_holding_its_shards():
    training = _training()
    assert set(training.drafts) == {MAIN, POINT}
    assert training.drafts[MAIN] == DraftWindows.main(WINDOWS)
    assert training.drafts[POINT] == DraftWindows.point(WINDOWS, SHARDS, 2, 4)
    assert training.draft_window_shards(POINT, "1", "0") == ["a", "b", "a", "b"]  # epoch 1: one window


def test_each_shard_is_in_one_plan_window_per_epoch():
    training = _training()
    assert [training.window_of(0, k) for k in SHARDS] == [0, 1, 0, 1]
    assert [training.window_of("1", k) for k in SHARDS] == [1, 1, 0, 0]


def test_a_draft_window_starts_from_its_previous_state_and_ends_in_its_last():
    training = _training()
    assert training_state("results/r", "{epoch}", "{window}", "{variant}") == (
        "results/r/{variant}draft/windows/epoch-{epoch}/window-{window}.pt"
    )
    assert training.previous_state("0", "0") == []
    assert training.previous_state("1", "0") == ["results/r/draft/windows/epoch-0/window-1.pt"]
    assert training.previous_state("1", "0", POINT) == [f"results/r/{POINT}draft/windows/epoch-0/window-1.pt"]
    assert training.last_state() == "results/r/draft/windows/epoch-1/window-1.pt"
    assert training.last_state(POINT) == f"results/r/{POINT}draft/windows/epoch-1/window-0.pt"


def test_extraction_waits_for_every_draft_reading_the_previous_plan_window():
    training = _training()
    assert training.extraction_gate("0", "a") is None  # the first plan window: the plan's check alone
    # epoch 0's second plan window: both drafts read the first (the point's "a")
    assert training.extraction_gate("0", "b") == [
        "results/r/draft/windows/epoch-0/window-0.pt",
        f"results/r/{POINT}draft/windows/epoch-0/window-0.pt",
    ]
    # epoch 1's first: after epoch 0's last, which the point read in its window 1
    assert training.extraction_gate("1", "c") == [
        "results/r/draft/windows/epoch-0/window-1.pt",
        f"results/r/{POINT}draft/windows/epoch-0/window-1.pt",
    ]
    # epoch 1's second: the point has no window in epoch 1's first plan window
    assert training.extraction_gate("1", "a") == ["results/r/draft/windows/epoch-1/window-0.pt"]


def test_a_draft_window_reads_its_epochs_states_and_a_point_no_validation_states():
    training = _training()
    assert training.window_states("train", MAIN, "1", "0") == [
        "results/r/hidden_states/epoch-1/train/shard-c.safetensors",
        "results/r/hidden_states/epoch-1/train/shard-d.safetensors",
    ]
    assert training.window_states("validation", POINT, "1", "0") == []
    assert len(training.window_states("train", POINT, "1", "0")) == 4  # its shards, cycled
    # offline validation: the main draft's last window's, still on disk
    assert training.validation_states() == [
        "results/r/hidden_states/epoch-1/validation/shard-a.safetensors",
        "results/r/hidden_states/epoch-1/validation/shard-b.safetensors",
    ]


def test_under_a_cap_a_point_reads_its_shards_in_the_windows_holding_them_as_often_as_uncapped():
    shards = ["a", "b", "c", "d"]
    windows = [[["a", "c"], ["b", "d"]], [["c", "d"], ["a", "b"]]]  # two epochs, two windows each
    # the point of 2 shards: each read twice an epoch (cycled_shards), both times in the window holding it
    assert point_windows(windows, shards, 2, 4) == [
        [(0, ["a", "a"]), (1, ["b", "b"])],
        [(1, ["a", "b", "a", "b"])],  # round-robin; window 0 holds neither of its shards: not one of its
    ]
    # the point of 3 of 4 entries: a twice, b and c once (as cycled_shards), wherever they are
    assert point_windows(windows, shards, 3, 4) == [
        [(0, ["a", "c", "a"]), (1, ["b"])],
        [(0, ["c"]), (1, ["a", "b", "a"])],
    ]
    for k in (1, 2, 3, 4):  # the same reads per epoch as uncapped
        for epoch in point_windows(windows, shards, k, 4):
            reads = sorted(s for _, entries in epoch for s in entries)
            assert reads == sorted(cycled_shards(shards, k, 4))
    assert point_windows(windows, shards, 4, 4)[0] == [(0, ["a", "c"]), (1, ["b", "d"])]  # the main draft's
