"""The plan under hidden_states.max_disk_gb, as arithmetic on byte counts: which shards are on disk
together.

Given the room the cap leaves beside the training state files (WindowSizing.room) and each shard's
states' bytes, the plan is a WindowPlan: when every shard fits at once, one extraction pass whose
states stay for every epoch (as uncapped); else per epoch plan windows of shards whose states are
extracted, trained on and deleted, so the disk holds at most one window, whatever the corpus size.
A shard counts its states once (its parts are moved into its packed file one at a time, each deleted
once written); on top, one batch part for each shard that may be packing at once: at most
hidden_states.pack_slots of them, whatever the window's size (hidden_states/packing.pack_slot: a
shard's packing holds one of the run's pack slots), so a window reserves min(pack_slots, its shards)
parts (pack_reserve). Each epoch orders the shards anew, seeded by train.seed and the epoch
(epoch_order), and cuts that order into windows that fit (cut_windows).

What the config and the checked traces make of it when the workflow is parsed (the shards' sizes, the
room) is planning/disk_cap.py's. Words: planning/__init__.py.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eagle3_pipeline.planning.state_files import STATE_FILES_AT_ONCE
from eagle3_pipeline.state_bytes import DiskBudgetError, format_bytes


def epoch_order(seed: int, epoch: int, shards: Sequence[str]) -> list[str]:
    """The shards in the order of one epoch under a cap, seeded by (seed, epoch): a new order every
    epoch, so a shard meets other shards' samples in its batches from one epoch to the next."""
    order = list(shards)
    # a str seed is hashed with SHA-512 (random.seed, version 2): the same order on every machine
    random.Random(f"windows:{seed}:{epoch}").shuffle(order)
    return order


def pack_reserve(states: Iterable[int], part: int, slots: int) -> int:
    """What a window of shards of these `states` reserves on top of them for packing: at most `slots`
    of its shards pack at once (hidden_states/packing.pack_slot), each with one part in flight of at
    most min(part, its states); the largest `slots` of those (min(slots, shards) parts for equal ones)."""
    return sum(heapq.nlargest(max(int(slots), 1), (min(part, s) for s in states)))


def cut_windows(
    order: Sequence[str], states: Mapping[str, int], room: int, part: int = 0, slots: int = 1
) -> list[list[str]]:
    """Consecutive shards of `order` in windows whose states, with the window's pack_reserve (`part`,
    `slots`), take at most `room`: each window takes shards until the next would not fit (for equal
    shards: the most n with n x states + min(slots, n) x part <= room).

    Raises:
        DiskBudgetError: one shard alone (with its part) does not fit `room`.
    """
    slots = max(int(slots), 1)
    windows: list[list[str]] = []
    current: list[str] = []
    used = 0
    extras: list[int] = []  # a min-heap of the window's `slots` largest parts in flight
    for shard in order:
        size, extra = states[shard], min(part, states[shard])
        if size + extra > room:
            raise DiskBudgetError(
                f"shard {shard}: its hidden states take {format_bytes(size + extra)} while extracted, more "
                f"than the {format_bytes(room)} hidden_states.max_disk_gb leaves beside the training state "
                "files: raise the cap or lower dataset.shard_size"
            )
        reserve = sum(extras)
        grown = reserve + extra if len(extras) < slots else reserve + max(0, extra - extras[0])
        if current and used + size + grown > room:
            windows.append(current)
            current, used, extras = [], 0, []
        current.append(shard)
        used += size
        if len(extras) < slots:
            heapq.heappush(extras, extra)
        else:
            heapq.heappushpop(extras, extra)
    if current:
        windows.append(current)
    return windows


def sized_windows(
    seed: int,
    epochs: int,
    shards: Sequence[str],
    states: Mapping[str, int],
    room: int,
    part: int = 0,
    slots: int = 1,
) -> list[list[list[str]]] | None:
    """The windows of every epoch for shards of these `states` under `room` bytes, each window with its
    pack_reserve (`part`, `slots`; part 0: `states` are whole peaks): None when every shard fits at
    once (one extraction pass, the states kept for all epochs), else per epoch epoch_order cut by
    cut_windows, each window's shards sorted. The number of windows can differ between epochs when the
    shards differ in size."""
    if sum(states[k] for k in shards) + pack_reserve((states[k] for k in shards), part, slots) <= room:
        return None
    orders = [epoch_order(seed, e, shards) for e in range(epochs)]
    return [[sorted(w) for w in cut_windows(order, states, room, part, slots)] for order in orders]


@dataclass(frozen=True)
class WindowSizing:
    """What sizes the plan under hidden_states.max_disk_gb (window_sizing; plain values, so a rule can
    pass it to a job as params): the cap, one training state file, one shard's config bound, one
    batch's part, the epochs' seed and count, what a shard's check_disk_budget record must have been
    made for (hidden size, dtype, max_seq_len, overlong) to size it from its traces, and how many
    shards may pack at once (hidden_states.pack_slots: a window reserves a part for each), and the
    training state files on disk at once (state_files_at_once: 2 for each draft trained)."""

    cap_bytes: int
    state_file_bytes: int
    shard_bound: int
    part: int
    seed: int
    epochs: int
    hidden_size: int
    dtype: str
    max_seq_len: int
    overlong: str
    pack_slots: int = 1
    state_files: int = STATE_FILES_AT_ONCE

    def reserve(self, states: Iterable[int]) -> int:
        """What a window of shards of these states reserves for packing (pack_reserve)."""
        return pack_reserve(states, self.part, self.pack_slots)

    @property
    def room(self) -> int:
        """Bytes the hidden states may take at once: the cap less the training state files."""
        return self.cap_bytes - self.state_files * self.state_file_bytes

    def plan(
        self, shards: Sequence[str], states: Mapping[str, int] | None = None, source: str | None = None
    ) -> WindowPlan:
        """The plan for `shards`, each at its bytes in `states` where given (its traces), else at its
        config bound; `source` names where the sizes came from (default: traces, config or both)."""
        known = states or {}
        traced = sum(1 for k in shards if k in known)
        if source is None:
            source = "traces" if traced == len(shards) else "config" if not traced else "traces and config"
        sizes = {k: known.get(k, self.shard_bound) for k in shards}
        windows = sized_windows(self.seed, self.epochs, shards, sizes, self.room, self.part, self.pack_slots)
        return WindowPlan(source, list(shards), sizes, traced, windows, self)


@dataclass(frozen=True)
class WindowPlan:
    """How extraction fits hidden_states.max_disk_gb: one pass (`windows` None: every shard extracted
    once and kept for every epoch, as uncapped), or per epoch its windows of shard ids (extracted,
    trained on and deleted, once per epoch)."""

    source: str  # "config" (every shard at its bound), "traces" (their real bytes), "traces and config"
    shards: list[str]
    shard_bytes: Mapping[str, int]  # each shard's states (a window adds WindowSizing.reserve)
    traced: int  # shards sized from their traces
    windows: list[list[list[str]]] | None
    sizing: WindowSizing

    @property
    def room(self) -> int:
        """Bytes the states may take at once (the cap less the training state files)."""
        return self.sizing.room

    @property
    def state_file_bytes(self) -> int:
        return self.sizing.state_file_bytes

    @property
    def one_pass(self) -> bool:
        return self.windows is None

    @property
    def engine_scopes(self) -> int:
        """Extraction scopes (one engine job each under the vllm backend): 1, or every epoch's windows."""
        return 1 if self.windows is None else sum(len(windows) for windows in self.windows)

    @property
    def extraction_passes(self) -> int:
        """Passes over the corpus: 1, or one per epoch."""
        return 1 if self.windows is None else len(self.windows)

    @property
    def largest_window(self) -> int:
        """Shards in the largest window (every shard in one pass)."""
        if self.windows is None:
            return len(self.shards)
        return max(len(window) for windows in self.windows for window in windows)

    def _scopes(self) -> list[list[str]]:
        """The shards on disk together: every shard in one pass, else each window."""
        return [list(self.shards)] if self.windows is None else [w for ws in self.windows for w in ws]

    @property
    def held_bytes(self) -> int:
        """The most the states take at once: every shard's states in one pass, else the largest
        window's, with their parts in flight (WindowSizing.reserve: at most pack_slots shards pack)."""
        return max(
            sum(self.shard_bytes[k] for k in w) + self.sizing.reserve(self.shard_bytes[k] for k in w)
            for w in self._scopes()
        )

    @property
    def reserve_bytes(self) -> int:
        """The most any window (or the one pass) reserves for the parts being packed at once."""
        return max(self.sizing.reserve(self.shard_bytes[k] for k in w) for w in self._scopes())

    def describe(self) -> str:
        """One phrase: what the plan does and where its sizes came from."""
        sized = {
            "config": "each shard at its config bound",
            "traces": "each shard from its traces",
            "traces and config": f"{self.traced:,} of {len(self.shards):,} shards from their traces, "
            "the rest at their config bound",
        }.get(self.source, self.source)
        if self.windows is None:
            return f"every shard fits at once ({sized}): one extraction pass, its states kept for every epoch"
        counts = sorted({len(windows) for windows in self.windows})
        per_epoch = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        most = f"{self.largest_window:,} shard{'s' if self.largest_window != 1 else ''}"
        return (
            f"windows of at most {most} ({per_epoch} per epoch, {sized}) extracted, "
            f"trained on and deleted, once per epoch ({self.extraction_passes} extraction passes over the "
            "corpus)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "one_pass": self.one_pass,
            "engine_scopes": self.engine_scopes,
            "extraction_passes": self.extraction_passes,
            "shards": len(self.shards),
            "traced": self.traced,
            "largest_window": self.largest_window,
            "held_bytes": self.held_bytes,
            "pack_slots": self.sizing.pack_slots,
            "reserve_bytes": self.reserve_bytes,
            "room": self.room,
            "state_file_bytes": self.state_file_bytes,
            "state_files": self.sizing.state_files,
            "windows": self.windows,
        }


def describe_windows(windows: Sequence[Sequence[Sequence[str]]] | None) -> str:
    """A plan's windows in a few words: one pass, or the windows and extraction passes."""
    if windows is None:
        return "one extraction pass (1 engine start)"
    scopes = sum(len(epoch) for epoch in windows)
    passes = len(windows)
    return f"{scopes} windows over {passes} epochs ({scopes} engine starts, {passes} extraction passes)"
