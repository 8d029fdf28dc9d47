"""The acceptance arithmetic on hand-built cases."""

import numpy as np
import pytest

from eagle3_pipeline.validate.acceptance import (
    acceptance_lengths,
    conditional_rates,
    merge_counts,
    offline_acceptance,
    online_acceptance,
    prefix_counts,
)
from eagle3_pipeline.validate.metrics import SpecDecodeCounters


def test_prefix_counts_stop_at_the_first_wrong_step():
    correct = np.array(
        [
            [1, 1, 1],  # all three accepted
            [1, 0, 1],  # step 2 right, but after a miss: never accepted
            [0, 1, 1],
            [1, 1, 0],
        ],
        dtype=bool,
    )
    prefix, total = prefix_counts(correct)
    assert total == 4
    assert prefix.tolist() == [3, 2, 1]


def test_conditional_rates_divide_by_the_rows_that_reached_the_step():
    assert conditional_rates([3, 2, 1], 4) == [0.75, 2 / 3, 0.5]
    assert conditional_rates([0, 0], 5) == [0.0, None]  # nothing reached step 1


def test_acceptance_length_is_one_plus_sum_of_survival():
    # p = 0.5 each: 1 + .5 + .25 + .125
    assert acceptance_lengths([0.5, 0.5, 0.5]) == [1.5, 1.75, 1.875]
    assert acceptance_lengths([1.0, 1.0]) == [2.0, 3.0]
    assert acceptance_lengths([0.0, None]) == [1.0, 1.0]


def test_simulated_length_equals_the_mean_accepted_run():
    rng = np.random.default_rng(0)
    correct = rng.random((1000, 4)) < [0.8, 0.7, 0.6, 0.5]
    prefix, total = prefix_counts(correct)
    result = offline_acceptance(prefix.tolist(), correct.sum(axis=0).tolist(), total)
    run = np.cumprod(correct, axis=1).sum(axis=1)  # accepted drafts per anchor (k = 4)
    assert result.acceptance_length[-1] == pytest.approx(1 + run.mean())
    assert result.step_accuracy == pytest.approx(correct.mean(axis=0).tolist())


def test_merge_counts_sums_shards_and_refuses_nothing():
    a = {"anchors": 4, "prefix": [3, 2], "step_right": [3, 3]}
    b = {"anchors": 6, "prefix": [1, 0], "step_right": [1, 2]}
    assert merge_counts([a, b]) == {"anchors": 10, "prefix": [4, 2], "step_right": [4, 5]}
    with pytest.raises(ValueError, match="no validation shard"):
        merge_counts([])


def test_online_acceptance_from_counter_deltas():
    before = SpecDecodeCounters(100, 300, 150, (80, 50, 20))
    after = SpecDecodeCounters(200, 600, 330, (170, 110, 50))  # +100 drafts, +180 accepted
    result = online_acceptance(before, after)
    assert result.drafts == 100
    assert result.acceptance_length == pytest.approx(2.8)
    assert result.draft_acceptance_rate == pytest.approx(0.6)
    assert result.per_position_rate == pytest.approx([0.9, 0.6, 0.3])
    assert result.conditional == pytest.approx([0.9, 60 / 90, 0.5])


def test_online_acceptance_refuses_a_restart_between_readings():
    with pytest.raises(ValueError, match="restarted"):
        online_acceptance(
            SpecDecodeCounters(100, 300, 150, (80, 50, 20)), SpecDecodeCounters(5, 15, 3, (2, 1, 0))
        )


def test_online_acceptance_without_drafts_has_no_length():
    same = SpecDecodeCounters(10, 30, 12, (6, 4, 2))
    assert online_acceptance(same, same).acceptance_length is None
