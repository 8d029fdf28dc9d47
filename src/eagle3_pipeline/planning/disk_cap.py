"""hidden_states.max_disk_gb read from the config when the workflow is parsed: one shard's upper
bound, the cap's sizing (WindowSizing: the room beside the training state files), the plan the
workflow runs (window_plan: each shard whose traces are checked at its real bytes, traced_states,
else at its bound), and the check before a capped run's first extraction that the plan still holds
(check_window_plan).

A shard's states are its traces' real bytes where its check_disk_budget record is up to date (read
when the workflow is parsed), else its upper bound from the config (every sample as long as
max_seq_len), so the cap is never exceeded; a cap smaller than one shard's bound (plus a part) is
refused. The cap also holds the training state files that training keeps (planning/state_files.py).
How the windows are cut is planning/window_plan.py's; the free-space check, budget.py's.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagle3_pipeline import io
from eagle3_pipeline.config import SPLITS, shard_ids
from eagle3_pipeline.planning.state_files import drafts_note, parse_time_state_bytes, state_files_at_once
from eagle3_pipeline.planning.window_plan import WindowPlan, WindowSizing, describe_windows
from eagle3_pipeline.settings import Settings
from eagle3_pipeline.state_bytes import GB, DiskBudgetError, bytes_per_token, format_bytes
from eagle3_pipeline.target_shape import DEMO_HIDDEN_SIZE, TargetShape

logger = logging.getLogger(__name__)


def shard_bound_bytes(settings: Settings, hidden_size: int) -> int:
    """The most one shard's states can take: shard_size samples x max_seq_len tokens x bytes per token."""
    hs = settings.hidden_states
    return settings.dataset.shard_size * hs.max_seq_len * bytes_per_token(hidden_size, hs.dtype)


def part_bound_bytes(settings: Settings, hidden_size: int) -> int:
    """The most one batch's part takes (a batch holds up to batch_tokens, or one longer sequence)."""
    hs = settings.hidden_states
    return max(hs.batch_tokens, hs.max_seq_len) * bytes_per_token(hidden_size, hs.dtype)


def shard_peak_bytes(settings: Settings, hidden_size: int) -> int:
    """The most one shard takes on disk while it is extracted: its states once (the parts are moved
    into the packed file one at a time, each deleted once written: hidden_states/packing.py), plus the
    part being moved. A window of many shards reserves that part for at most hidden_states.pack_slots
    of them (pack_reserve)."""
    bound = shard_bound_bytes(settings, hidden_size)
    return bound + min(part_bound_bytes(settings, hidden_size), bound)


def shards_per_window(settings: Settings, hidden_size: int, state_bytes: int = 0) -> int | None:
    """Shards per training window under hidden_states.max_disk_gb (None: no cap, no windows).

    Decided from the config alone, at parse time: the most shards n with n x B + min(K, n) x P <=
    cap - 2S, B one shard's upper bound, P one batch's part (at most B), K hidden_states.pack_slots
    (shards packing at once) and S one training state file (`state_bytes`; 2S: STATE_FILES_AT_ONCE of
    them, for each draft trained, state_files_at_once): floor((cap - 2S - K x P) / B) when that is at
    least K, else floor((cap - 2S) / (B + P)). A
    shard is counted once: its parts are moved into the packed file one at a time and each deleted once
    written (shard_peak_bytes); every shard of a window may be extracted at the same time, at most K
    of them packing (hidden_states/packing.pack_slot).

    Raises:
        DiskBudgetError: the cap cannot hold one window of one shard; the message gives the numbers.
    """
    hs = settings.hidden_states
    cap_gb = hs.max_disk_gb
    if cap_gb is None:
        return None
    bound = shard_bound_bytes(settings, hidden_size)
    peak = shard_peak_bytes(settings, hidden_size)
    files = state_files_at_once(settings)
    states = files * state_bytes
    room = max(0, cap_gb * GB - states)
    slots = hs.pack_slots
    shards = int(max(0, room - slots * (peak - bound)) // bound)
    if shards < slots:  # fewer shards than pack slots: each of them may be packing at once
        shards = int(room // peak)
    if shards < 1:
        held = (
            f" plus {files} training state files of {format_bytes(state_bytes)}{drafts_note(settings)}"
            if state_bytes
            else ""
        )
        raise DiskBudgetError(
            f"hidden_states.max_disk_gb: {cap_gb} GB ({format_bytes(cap_gb * GB)}) cannot hold one shard's "
            f"hidden states while it is extracted{held}: one shard is at most dataset.shard_size "
            f"{settings.dataset.shard_size:,} samples x hidden_states.max_seq_len {hs.max_seq_len:,} "
            f"tokens x {bytes_per_token(hidden_size, hs.dtype):,} B/token (4 states x hidden size "
            f"{hidden_size:,} x {hs.dtype} + id/mask) = {format_bytes(bound)}, plus the batch part being "
            f"packed while it is extracted: {format_bytes(peak)}. Raise max_disk_gb to at least "
            f"{math.ceil((peak + states) / GB * 1000) / 1000:g} (rounded up), or lower "
            "dataset.shard_size or hidden_states.max_seq_len."
        )
    return shards


def parse_time_hidden_size(
    settings: Settings, needed_for: str = "hidden_states.max_disk_gb (its training windows)"
) -> int:
    """The target's hidden size for planning (a parsed workflow, the budget and cost commands): from
    target.model's config.json when it is on this machine, else the config's target.hidden_size (where
    the weights are not), else, for the embedded demo whose target a rule builds later, the demo's.

    Raises:
        DiskBudgetError: none of them is available; the message names `needed_for`, the config key and
        the file looked for. Also when target.hidden_size and the config.json disagree.
    """
    path = Path(settings.target.model) / "config.json"
    stated = settings.target.hidden_size
    if path.exists():
        found = TargetShape.load(path).hidden_size
        if stated and stated != found:
            raise DiskBudgetError(
                f"target.hidden_size {stated} differs from {path}'s {found}: fix or remove target.hidden_size"
            )
        return found
    if stated:
        return int(stated)
    if settings.demo.enabled:
        return DEMO_HIDDEN_SIZE
    raise DiskBudgetError(
        f"{needed_for} needs the target's hidden size, but target.hidden_size is not set and {path} "
        "does not exist (the target's weights are not on this machine): set target.hidden_size in the "
        "config (the hidden_size in the target's config.json, or in its text_config), "
        "or point target.model at the target's weights folder"
    )


def window_sizing(settings: Settings, hidden_size: int) -> WindowSizing | None:
    """The cap's sizing from the config and the target's hidden size (None: no cap).

    Raises:
        DiskBudgetError: the cap cannot hold one shard at its config bound (shards_per_window' message).
    """
    hs = settings.hidden_states
    if hs.max_disk_gb is None:
        return None
    state = parse_time_state_bytes(settings, hidden_size)
    shards_per_window(settings, hidden_size, state)  # a cap below one shard's bound: refused, with numbers
    return WindowSizing(
        cap_bytes=math.floor(hs.max_disk_gb * GB),
        state_file_bytes=state,
        shard_bound=shard_bound_bytes(settings, hidden_size),
        part=part_bound_bytes(settings, hidden_size),
        seed=settings.train.seed,
        epochs=settings.train.epochs,
        hidden_size=hidden_size,
        dtype=hs.dtype,
        max_seq_len=hs.max_seq_len,
        overlong=hs.overlong,
        pack_slots=hs.pack_slots,
        state_files=state_files_at_once(settings),
    )


def budget_record(results: str | Path, shard: str) -> Path:
    """Shard `shard`'s check_disk_budget record (rules/budget.smk)."""
    return Path(results) / "budget" / "hidden_states" / f"shard-{shard}.json"


def records_sizing(settings: Settings, hidden_size: int) -> WindowSizing:
    """What a shard's check_disk_budget record must have been made for (traced_states), capped or
    not: the cap's sizing, else one with these settings and no cap."""
    sizing = window_sizing(settings, hidden_size)
    if sizing is not None:
        return sizing
    hs = settings.hidden_states
    return WindowSizing(0, 0, 0, 0, settings.train.seed, settings.train.epochs, hidden_size,
                               hs.dtype, hs.max_seq_len, hs.overlong)  # fmt: skip


def traced_states(results: str | Path, shards: Sequence[str], sizing: WindowSizing) -> dict[str, int]:
    """Each shard's states' bytes from its traces, where its check_disk_budget record is up to date:
    newer than every split's trace file of the shard and made for the same hidden size and dtype (and,
    where the record names them, max_seq_len and overlong). Shards without one are left out (their
    config bound stands). Cheap enough for parse time: a stat per file and a small JSON per shard."""
    want = {
        "hidden_size": sizing.hidden_size,
        "dtype": sizing.dtype,
        "max_seq_len": sizing.max_seq_len,
        "overlong": sizing.overlong,
    }
    states = {}
    for shard in shards:
        record = budget_record(results, shard)
        traces = [Path(results) / "traces" / "shards" / split / f"shard-{shard}.parquet" for split in SPLITS]
        try:
            made = record.stat().st_mtime_ns
            if any(path.stat().st_mtime_ns > made for path in traces):
                continue
            data = json.loads(record.read_text())
            total = int(data["total_bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if all(data.get(key, value) == value for key, value in want.items()):
            states[shard] = total
    return states


def window_plan(
    settings: Settings, hidden_size: int, shards: Sequence[str], results: str | Path | None = None
) -> WindowPlan | None:
    """The plan under the cap (None: no cap): every shard at its config bound, or with `results` (the
    run's folder) each shard whose traces are checked at its real bytes (traced_states). This is what
    rules/common/windows.smk plans with when the workflow is parsed.

    Raises:
        DiskBudgetError: the cap cannot hold one shard at its config bound.
    """
    sizing = window_sizing(settings, hidden_size)
    if sizing is None:
        return None
    return sizing.plan(shards, traced_states(results, shards, sizing) if results is not None else None)


def config_plan(settings: Settings, hidden_size: int) -> WindowPlan | None:
    """The plan from the config alone (None: no cap): every shard of the config at its bound.

    Raises:
        DiskBudgetError: the cap cannot hold one shard at its config bound.
    """
    dataset = settings.dataset
    return window_plan(settings, hidden_size, shard_ids(dataset.num_samples, dataset.shard_size))


def confirm_window_plan(
    planned: Sequence[Sequence[Sequence[str]]] | None, current: WindowPlan, hidden_states_dir: str | Path
) -> dict[str, Any]:
    """The check before a capped run's first extraction (rule check_window_plan): the plan the workflow
    was parsed with (`planned`: its windows, None for one pass) is the one the shards' checked traces
    give now (`current`), and no states of the other layout are on disk beside it; returns the plan's
    JSON.

    Raises:
        DiskBudgetError: the traces plan otherwise (the run was planned before they were checked:
            nothing was extracted under the cap yet, a rerun plans from them), or states of the other
            layout (hidden_states/{split}/ for windows, hidden_states/epoch-*/ for one pass) would
            sit uncounted beside the plan's.
    """
    planned = None if planned is None else [[list(w) for w in epoch] for epoch in planned]
    if planned != current.windows:
        raise DiskBudgetError(
            f"hidden_states.max_disk_gb: this run was planned, when the workflow was parsed, as "
            f"{describe_windows(planned)}, but the shards' checked traces now plan "
            f"{describe_windows(current.windows)} ({current.describe()}). Nothing has been extracted under "
            "the cap yet: run snakemake again, which plans from the traces (the windows are chosen when the "
            "workflow is parsed; docs/hidden_states.md)"
        )
    root = Path(hidden_states_dir)
    pattern = "epoch-*/{split}/*.safetensors" if current.one_pass else "{split}/*.safetensors"
    stray = sorted(p for split in SPLITS for p in root.glob(pattern.format(split=split)))
    if stray:
        layout = "in windows, per epoch" if current.one_pass else "in one pass"
        raise DiskBudgetError(
            f"hidden_states.max_disk_gb: {len(stray)} hidden-state files extracted {layout} by an earlier "
            f"plan are still under {root} (e.g. {stray[0]}), outside this plan ({current.describe()}) and "
            "not counted in the cap: delete them (the plan extracts what it needs again)"
        )
    return current.to_json()


def check_window_plan(
    planned: Sequence[Sequence[Sequence[str]]] | None,
    sizing: WindowSizing,
    shards: Sequence[str],
    results: str | Path,
    output: str | Path,
) -> WindowPlan:
    """Rule check_window_plan: the plan from every shard's checked traces (traced_states, as the
    workflow plans when parsed) confirmed against the one the run was parsed with (confirm_window_plan),
    and written to `output`.

    Raises:
        DiskBudgetError: see confirm_window_plan.
    """
    current = sizing.plan(shards, traced_states(results, shards, sizing))
    record = confirm_window_plan(planned, current, Path(results) / "hidden_states")
    logger.info("hidden_states.max_disk_gb: %s", current.describe())
    io.write_json(record, output, indent=1)
    return current
