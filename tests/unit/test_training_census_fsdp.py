"""The census under train.fsdp (memory_census.Census.sharded_peak): over 8 GPUs each holds an eighth of
the trained weights and of AdamW's state, plus the weights gathered whole during forward and backward,
so the Kimi-K2.5 example's step needs less than with DDP's full replica."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from memory_census import GIB, KIMI, REDUCED  # noqa: E402
from training import census_of, trainable_bytes  # noqa: E402


def test_fsdp_shards_the_weights_and_adamw_state_of_the_kimi_step():
    census = census_of(REDUCED, "training", KIMI)
    ddp, ddp_parts, _ = census.peak()
    fsdp, parts = census.sharded_peak(8)
    assert parts["optimizer_state"] == pytest.approx(ddp_parts["optimizer_state"] / 8, rel=1e-6)
    assert parts["trainable"] == pytest.approx(ddp_parts["trainable"] / 8, rel=1e-6)
    assert parts["gathered_weights"] == ddp_parts["trainable"]  # gathered whole for the step
    # what sharding saves: 7/8 of AdamW's state, less the eighth of the weights held besides the gathered
    saved = ddp_parts["optimizer_state"] * 7 / 8 - ddp_parts["trainable"] / 8
    assert fsdp == pytest.approx(ddp - saved, rel=1e-3) and fsdp < ddp - 6 * GIB, (ddp, fsdp)
    one, _ = census.sharded_peak(1)
    assert one >= ddp  # one process: nothing sharded, the gathered copy on top


def test_fsdp_gathers_the_kimi_step_in_bf16_and_needs_less():
    fp32, _ = census_of(REDUCED, "training", KIMI).sharded_peak(8)
    bf16, parts = census_of(REDUCED, "fsdp_bf16", KIMI).sharded_peak(8)
    assert parts["gathered_weights"] == pytest.approx(trainable_bytes(KIMI) / 2, rel=1e-3)  # bf16
    assert parts["trainable"] == pytest.approx(trainable_bytes(KIMI) / 8, rel=1e-3)  # fp32 shards
    assert bf16 < fp32 - parts["gathered_weights"], (bf16, fp32)  # the halved copy and more
