"""The batches of each training window under a disk cap (hidden_states.max_disk_gb).

When the hidden states of the whole corpus do not fit the cap, the shards are grouped into windows; per
epoch and window, the window's states are extracted, trained on by one train_draft_window job and
deleted (Snakemake temp files), the training state (weights, optimiser, schedule, history) carried
from window to window in a file. The learning-rate schedule spans the whole run, so its length must be
known before the first window is trained: plan_windows counts every (epoch, window)'s batches from the
traces' token-id lengths, which are the lengths extraction stores (same truncation, same drop rule).
Which shards form a window changes every epoch (planning.window_plan.sized_windows, seeded by
train.seed and the epoch); the plan records them, and each window's batches are shuffled anew (order_key).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from eagle3_pipeline import io
from eagle3_pipeline.draft.data import plan_batches
from eagle3_pipeline.settings import Batching, HiddenStatesSettings, Lengths, TrainSettings

log = logging.getLogger(__name__)


def order_key(epoch: int, window: int) -> int:
    """The batch order's `epoch` argument for (epoch, window): every window of every epoch shuffled anew."""
    return epoch * 100_003 + window


def stored_lengths(trace_path: str | Path, max_seq_len: int, overlong: str) -> list[int]:
    """Token counts of one shard's samples as extraction stores them (prompt + completion ids, in file
    order): truncated to max_seq_len (dropped when no completion token is left) or dropped (overlong:
    drop). Rows without token ids (rebuilt from the chat template) cannot be counted here."""
    frame = pl.read_parquet(trace_path, columns=["prompt_token_ids", "completion_token_ids"])
    lengths = []
    for prompt, completion in zip(
        frame["prompt_token_ids"].list.len().fill_null(0),
        frame["completion_token_ids"].list.len().fill_null(0),
        strict=True,
    ):
        if not prompt or not completion:
            raise ValueError(
                f"{trace_path}: a trace without token ids; windowed training (hidden_states.max_disk_gb) "
                "needs the server's token ids"
            )
        total = prompt + completion
        if total > max_seq_len and (overlong == "drop" or prompt >= max_seq_len):
            continue
        lengths.append(min(total, max_seq_len))
    return lengths


def plan_windows(
    epoch_windows: Sequence[Sequence[Sequence[str]]],
    shard_traces: Mapping[str, str | Path],
    train: TrainSettings | Batching,
    hidden_states: HiddenStatesSettings | Lengths,
) -> dict[str, Any]:
    """Batches of every (epoch, window), counted as the trainer will form them (all processes together),
    and the windows themselves (shard ids per epoch and window, as the rules assigned them).

    Args:
        epoch_windows: per epoch, per window, its shard ids (planning.window_plan.sized_windows).
        shard_traces: each shard id's train-split trace file.
        train: config train.* (epochs, batch_tokens, seed).
        hidden_states: config hidden_states.* (max_seq_len, overlong: the lengths extraction stores).
    """
    if len(epoch_windows) != train.epochs:
        raise ValueError(f"windows for {len(epoch_windows)} epochs, but train.epochs is {train.epochs}")
    batch_tokens = train.batch_tokens
    lengths = {
        shard: [
            min(n, batch_tokens)
            for n in stored_lengths(path, hidden_states.max_seq_len, hidden_states.overlong)
        ]
        for shard, path in shard_traces.items()
    }
    samples = [[[n for k in window for n in lengths[k]] for window in windows] for windows in epoch_windows]
    batches = [
        [
            len(plan_batches(window, batch_tokens, train.seed, order_key(e, w)))
            for w, window in enumerate(windows)
        ]
        for e, windows in enumerate(samples)
    ]
    return {
        "windows": [[list(window) for window in windows] for windows in epoch_windows],
        "batches": batches,
        "samples": [[len(window) for window in windows] for windows in samples],
    }


def write_plan(plan: dict[str, Any], output: str | Path) -> None:
    io.write_json(plan, output, indent=1)


def total_steps(plan_path: str | Path, world: int) -> int:
    """Optimiser steps of the whole run for `world` processes (each takes floor(batches / world))."""
    plan = json.loads(Path(plan_path).read_text())
    return sum(count // world for epoch in plan["batches"] for count in epoch)
