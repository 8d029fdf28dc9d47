"""The memory census with an MLA draft (benchmarks/training.py --census --draft deepseek_mla): its replay
from the reduced MLA shape agrees with the step tracked directly at a small MLA shape, every named size
of the reduced shape is distinct, and the Kimi-K2.5 example's step with the MLA draft fits the issue's
64 GiB per GPU, below the Llama draft's (fewer trained weights: no 2H-wide q/k/v of 64 x 128)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from memory_census import GIB, KIMI, KIMI_MLA, REDUCED_MLA, Scaler, block_rows  # noqa: E402
from training import census_of, census_peak, trainable_bytes  # noqa: E402

DEMO_MLA = replace(KIMI_MLA, hidden=128, heads=2, head_dim=16, intermediate=384, vocab=1024, draft_vocab=1024)
DEMO_MLA = replace(DEMO_MLA, seq=128, mla=(96, 64, 32, 16, 32))


def test_the_reduced_mla_shape_names_every_size_once():
    Scaler(REDUCED_MLA, KIMI_MLA, block_rows(KIMI_MLA))  # raises when two named sizes coincide


def test_the_mla_replay_agrees_with_the_step_tracked_at_a_small_mla_shape():
    tracked = census_peak(DEMO_MLA, "training", None)[0]
    replayed = census_peak(REDUCED_MLA, "training", DEMO_MLA)[0]
    assert tracked <= replayed <= 1.15 * tracked, (tracked, replayed)  # every block at its largest


def test_the_kimi_example_step_with_an_mla_draft_fits_64_gib_per_gpu():
    peak, parts, _ = census_peak(REDUCED_MLA, "training", KIMI_MLA)
    assert peak <= 64 * GIB, parts
    assert trainable_bytes(KIMI_MLA) < trainable_bytes(KIMI)


def test_the_kimi_example_step_with_an_mla_draft_under_fsdp_in_bf16_fits_64_gib_per_gpu():
    peak, parts = census_of(REDUCED_MLA, "fsdp_bf16", KIMI_MLA).sharded_peak(8)
    assert peak <= 64 * GIB, parts  # benchmarks/training.py --census --shape kimi --draft deepseek_mla
    assert parts["gathered_weights"] == pytest.approx(trainable_bytes(KIMI_MLA) / 2, rel=1e-3)
