"""What the stored hidden states weigh: four states plus an id and a mask per token (state_bytes.py)."""

from __future__ import annotations

import pytest

from eagle3_pipeline.state_bytes import bytes_per_token


def test_bytes_per_token_counts_four_states_plus_id_and_mask():
    assert bytes_per_token(7168) == 4 * 7168 * 2 + 9 == 57353  # Kimi-K2.5, bf16
    assert bytes_per_token(128, "float32") == 4 * 128 * 4 + 9
    with pytest.raises(ValueError, match="unknown hidden_states.dtype 'int8'"):
        bytes_per_token(128, "int8")


def test_an_8k_kimi_sample_costs_about_470_mb():
    assert 8192 * bytes_per_token(7168) == pytest.approx(470e6, rel=0.01)
