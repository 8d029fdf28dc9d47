"""Training in windows of shards under a disk cap (hidden_states.max_disk_gb).

When the hidden states of the whole corpus do not fit the cap, the shards are grouped into windows; per
epoch and window, the window's states are extracted, trained on by one train_draft_window job and
deleted (Snakemake temp files), the training state (weights, optimiser, schedule, history) carried
from window to window in a file. The learning-rate schedule spans the whole run, so its length must be
known before the first window is trained: plan_windows counts every (epoch, window)'s batches from the
traces' token-id lengths, which are the lengths extraction stores (same truncation, same drop rule).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from eagle3_pipeline import io
from eagle3_pipeline.draft.data import plan_batches

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
    windows: Sequence[Sequence[str | Path]],
    epochs: int,
    max_seq_len: int,
    overlong: str,
    batch_tokens: int,
    seed: int,
) -> dict[str, Any]:
    """Batches of every (epoch, window), counted as the trainer will form them (all processes together).

    Args:
        windows: per window, its shards' train-split trace files, in shard order.
        epochs, batch_tokens, seed: config train.*.
        max_seq_len, overlong: config hidden_states.*.
    """
    lengths = [
        [min(n, batch_tokens) for path in window for n in stored_lengths(path, max_seq_len, overlong)]
        for window in windows
    ]
    batches = [
        [len(plan_batches(lengths[w], batch_tokens, seed, order_key(e, w))) for w in range(len(windows))]
        for e in range(epochs)
    ]
    return {"batches": batches, "samples": [len(window) for window in lengths]}


def write_plan(plan: dict[str, Any], output: str | Path) -> None:
    io.write_json(plan, output, indent=1)


def total_steps(plan_path: str | Path, world: int) -> int:
    """Optimiser steps of the whole run for `world` processes (each takes floor(batches / world))."""
    plan = json.loads(Path(plan_path).read_text())
    return sum(count // world for epoch in plan["batches"] for count in epoch)
