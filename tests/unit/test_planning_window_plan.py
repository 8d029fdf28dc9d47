"""planning.window_plan: shards cut into windows under a byte room, each window reserving a part for
each shard that may pack at once, every epoch in its own seeded order (arithmetic alone)."""

from __future__ import annotations

import pytest

from eagle3_pipeline.planning.window_plan import (
    cut_windows,
    epoch_order,
    pack_reserve,
    sized_windows,
)
from eagle3_pipeline.state_bytes import DiskBudgetError


def test_a_window_reserves_a_part_for_each_pack_slot_not_each_shard():
    assert pack_reserve([100] * 10, 7, 4) == 4 * 7  # min(slots, shards) parts
    assert pack_reserve([100] * 3, 7, 4) == 3 * 7
    assert pack_reserve([5, 100, 3, 100], 7, 2) == 7 + 7  # the largest parts in flight: min(part, states)
    assert pack_reserve([5, 3], 7, 4) == 5 + 3  # a part is never more than its shard's states
    shards = [f"{k:05d}" for k in range(10)]
    states = dict.fromkeys(shards, 100)
    # every shard at once: 1,000 B + 4 parts of 7 = 1,028; one part per shard would be 1,070
    assert sized_windows(0, 2, shards, states, 1028, part=7, slots=4) is None
    assert sized_windows(0, 2, shards, states, 1027, part=7, slots=4) is not None  # a byte short
    assert sized_windows(0, 2, shards, states, 1028, part=7, slots=10) is not None  # 10 packing: 1,070
    # windows: the most n with 100 n + 7 min(4, n) <= room
    assert [len(w) for w in cut_windows(shards, states, 528, part=7, slots=4)] == [5, 5]
    assert [len(w) for w in cut_windows(shards, states, 527, part=7, slots=4)] == [4, 4, 2]
    assert [len(w) for w in cut_windows(shards, states, 321, part=7, slots=4)] == [3, 3, 3, 1]
    with pytest.raises(DiskBudgetError, match="shard 00000"):
        cut_windows(shards, states, 106, part=7, slots=4)  # one shard and its part: 107


def test_equal_shards_give_the_fixed_size_windows():
    shards = [f"{k:05d}" for k in range(10)]
    peaks = dict.fromkeys(shards, 100)
    windows = sized_windows(7, 3, shards, peaks, 399)  # floor(399 / 100) = 3 shards a window
    orders = [epoch_order(7, e, shards) for e in range(3)]  # each epoch's order, cut every 3 shards
    assert windows == [[sorted(order[i : i + 3]) for i in range(0, 10, 3)] for order in orders]
    assert [len(w) for w in windows[0]] == [3, 3, 3, 1]


def test_windows_are_cut_from_each_shards_own_bytes():
    shards = [f"{k:05d}" for k in range(8)]
    peaks = {k: 100 * (1 + i % 3) for i, k in enumerate(shards)}  # 100, 200 or 300 bytes
    windows = sized_windows(0, 4, shards, peaks, 400)
    assert windows is not None and len(windows) == 4
    for epoch, epoch_windows_ in enumerate(windows):
        assert sorted(k for w in epoch_windows_ for k in w) == shards  # every shard once an epoch
        assert all(sum(peaks[k] for k in w) <= 400 for w in epoch_windows_)  # each window fits
        # greedy in the epoch's order: a window ends only where the next shard would not fit
        order = epoch_order(0, epoch, shards)
        starts = [order.index(min(w, key=order.index)) for w in epoch_windows_]
        for w, start in zip(epoch_windows_[:-1], starts[1:], strict=True):
            assert sum(peaks[k] for k in w) + peaks[order[start]] > 400
    assert sized_windows(0, 4, shards, peaks, 300 * 3 + 200 * 3 + 100 * 2) is None  # all fit: one pass
    with pytest.raises(DiskBudgetError, match=r"shard \d{5}: its hidden states take 300 B while extracted"):
        sized_windows(0, 1, shards, peaks, 250)
