"""Windows under a disk cap: a seeded assignment of shards to windows, new every epoch
(planning.window_plan.sized_windows), and the plan that records it with every window's batch count."""

from __future__ import annotations

import polars as pl
import pytest

from eagle3_pipeline.draft.data import plan_batches
from eagle3_pipeline.draft.window_batches import order_key, plan_windows
from eagle3_pipeline.planning.window_plan import sized_windows
from eagle3_pipeline.settings import HiddenStatesSettings, TrainSettings

SHARDS = [f"{k:05d}" for k in range(23)]


def equal_windows(seed: int, epochs: int, shards: list[str], size: int) -> list[list[list[str]]] | None:
    """sized_windows for shards of one byte each under a cap of `size` bytes: `size` shards a window."""
    return sized_windows(seed, epochs, shards, dict.fromkeys(shards, 1), size)


def test_each_epoch_is_a_permutation_of_the_shards_cut_into_windows():
    for windows in equal_windows(7, 4, SHARDS, 5):
        assert [len(window) for window in windows] == [5, 5, 5, 5, 3]
        assert sorted(k for window in windows for k in window) == SHARDS  # each shard once
        assert all(window == sorted(window) for window in windows)


def test_the_assignment_is_seeded_and_new_every_epoch():
    epochs = equal_windows(7, 4, SHARDS, 5)
    assert epochs == equal_windows(7, 4, list(SHARDS), 5)  # reproducible
    assert all(a != b for i, a in enumerate(epochs) for b in epochs[i + 1 :])  # every epoch differs
    assert epochs[0] != [SHARDS[i : i + 5] for i in range(0, 23, 5)]  # not the contiguous groups
    assert equal_windows(8, 1, SHARDS, 5)[0] != epochs[0]  # another seed, another assignment
    # shards of one window of epoch 0 end up in several windows of epoch 1
    first = set(epochs[0][0])
    assert sum(bool(first & set(window)) for window in epochs[1]) > 1


def test_a_cap_that_holds_every_shard_makes_no_windows():
    assert equal_windows(0, 3, SHARDS, 23) is None  # one extraction pass, kept for every epoch


def _traces(root, lengths):  # noqa: ANN001, ANN202
    """One train-split trace file per shard, its samples' prompt and completion ids of those lengths."""
    paths = {}
    for shard, samples in lengths.items():
        paths[shard] = root / f"shard-{shard}.parquet"
        pl.DataFrame(
            {
                "prompt_token_ids": [list(range(prompt)) for prompt, _ in samples],
                "completion_token_ids": [list(range(completion)) for _, completion in samples],
            }
        ).write_parquet(paths[shard])
    return paths


def test_the_plan_records_each_epochs_windows_and_counts_their_batches(tmp_path):
    lengths = {
        "00000": [(10, 20), (5, 5)],
        "00001": [(30, 40)],
        "00002": [(3, 4), (8, 9), (60, 70)],  # 130 tokens: cut to max_seq_len 100
    }
    traces = _traces(tmp_path, lengths)
    windows = equal_windows(3, 2, sorted(lengths), 2)
    hidden_states = HiddenStatesSettings(max_seq_len=100, overlong="truncate")
    plan = plan_windows(windows, traces, TrainSettings(epochs=2, batch_tokens=64, seed=3), hidden_states)
    assert plan["windows"] == windows
    stored = {shard: [min(p + c, 100, 64) for p, c in samples] for shard, samples in lengths.items()}
    for e, epoch in enumerate(windows):
        for w, window in enumerate(epoch):
            samples = [n for k in window for n in stored[k]]
            assert plan["samples"][e][w] == len(samples)
            assert plan["batches"][e][w] == len(plan_batches(samples, 64, 3, order_key(e, w)))
    with pytest.raises(ValueError, match="windows for 2 epochs, but train.epochs is 3"):
        plan_windows(windows, traces, TrainSettings(epochs=3, batch_tokens=64, seed=3), hidden_states)


def test_a_windows_batches_are_shuffled_anew_every_epoch_and_reproducibly():
    lengths = [(7 * i) % 50 + 5 for i in range(40)]
    orders = [plan_batches(lengths, 64, 0, order_key(epoch, 1)) for epoch in range(3)]
    assert orders == [plan_batches(lengths, 64, 0, order_key(epoch, 1)) for epoch in range(3)]
    assert all(sorted(i for batch in order for i in batch) == list(range(40)) for order in orders)
    assert orders[0] != orders[1] != orders[2] != orders[0]  # a new order (and grouping) every epoch
    assert plan_batches(lengths, 64, 0, order_key(0, 2)) != orders[0]  # and every window
