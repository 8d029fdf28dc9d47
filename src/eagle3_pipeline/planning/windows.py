"""Training in windows under hidden_states.max_disk_gb: which plan window holds a shard, the windows
each draft trains in, the training states passed from one draft window to the next, what an
extraction job waits for, and the hidden states a draft window and offline validation read.

The plan's windows (window_plan.WindowPlan.windows: per epoch, the shards on disk together) are made when
the workflow is parsed; TrainingWindows turns them into paths. Words: planning/__init__.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TypeVar

from eagle3_pipeline.planning.variants import MAIN, Variants, cycled_shards

EpochWindows = Sequence[Sequence[Sequence[str]]]  # per epoch, per plan window, its shard ids
T = TypeVar("T")


def point_windows(
    epoch_windows: Sequence[Sequence[Sequence[T]]], shards: Sequence[T], k: int, entries: int
) -> list[list[tuple[int, list[T]]]]:
    """Under a disk cap in windows: per epoch, the windows the point of the first k of `shards` trains
    in, as (the main draft's window it shares, the point's entries in it), in window order.

    The point reads only its own shards and only while the main draft's window has them on disk: each
    of its k shards is in one window per epoch, and is read there as often as in `cycled_shards` (so an
    epoch still has `entries` entries: the main draft's steps), round-robin with its other shards in
    that window. A window without any of the point's shards is not one of its windows. The repeats of a
    shard fall in one window rather than across the epoch: the batches are the same, in another order.

    Args:
        epoch_windows: per epoch, per window, the shard ids the main draft's window holds (WINDOW_PLAN).
        shards: every training shard, in the stable order the point's first k are taken from.
        k: the point's shards.
        entries: shard entries in one of its epochs (epoch_entries).
    """
    reads = Counter(cycled_shards(shards, k, entries))
    planned = []
    for windows in epoch_windows:
        epoch = []
        for index, window in enumerate(windows):
            own = [shard for shard in window if shard in reads]
            if own:
                rounds = max(reads[shard] for shard in own)
                cycled = [shard for r in range(rounds) for shard in own if reads[shard] > r]
                epoch.append((index, cycled))
        planned.append(epoch)
    return planned


@dataclass(frozen=True)
class DraftWindows:
    """The windows one draft trains in under a cap: per epoch, per draft window of its own (numbered
    from 0), the plan window it shares (whose states are on disk while it trains) and the shard entries
    it reads there. The main draft trains in every plan window on its shards; a validate.learning_curve
    point in those holding some of its shards (point_windows), at least one an epoch."""

    epochs: list[list[tuple[int, list[str]]]]

    @classmethod
    def main(cls, windows: EpochWindows) -> DraftWindows:
        """The main draft's: every plan window (WindowPlan.windows), as it is."""
        return cls([[(w, list(shards)) for w, shards in enumerate(epoch)] for epoch in windows])

    @classmethod
    def point(cls, windows: EpochWindows, shards: Sequence[str], k: int, entries: int) -> DraftWindows:
        """A learning-curve point's, on the first k of `shards` (entries per epoch: epoch_entries)."""
        return cls(point_windows(windows, shards, k, entries))

    def count(self, epoch: int) -> int:
        """Its draft windows in epoch `epoch`."""
        return len(self.epochs[epoch])

    def shards(self, epoch: int, window: int) -> list[str]:
        """The shard entries its draft window `window` of epoch `epoch` reads (a shard may repeat)."""
        return self.epochs[epoch][window][1]

    def reading(self, epoch: int, plan_window: int) -> int | None:
        """Its draft window that reads plan window `plan_window` of epoch `epoch` (None: it has none)."""
        return next((w for w, (shared, _) in enumerate(self.epochs[epoch]) if shared == plan_window), None)

    def previous(self, epoch: int, window: int) -> tuple[int, int] | None:
        """(epoch, window) of the draft window before (epoch, window): the one it starts from; None first."""
        if window > 0:
            return epoch, window - 1
        return (epoch - 1, self.count(epoch - 1) - 1) if epoch > 0 else None

    def last(self) -> tuple[int, int]:
        """(epoch, window) of its last draft window: the state training ends with."""
        return len(self.epochs) - 1, self.count(len(self.epochs) - 1) - 1

    def shard_lists(self) -> list[list[list[str]]]:
        """Per epoch, per draft window, its shard entries: what plan_windows records and counts batches of."""
        return [[list(shards) for _, shards in epoch] for epoch in self.epochs]


def drafts_in_windows(windows: EpochWindows, variants: Variants) -> dict[str, DraftWindows]:
    """{variant: its draft windows}: the main draft's (every plan window) and each learning-curve
    point's (those holding its shards, each shard read as often per epoch as without a cap)."""
    drafts = {MAIN: DraftWindows.main(windows)}
    for variant, k in variants.curve.items():
        drafts[variant] = DraftWindows.point(windows, variants.shards, k, variants.epoch_entries(k))
    return drafts


def training_state(results: str, epoch: int | str, window: int | str, variant: str = MAIN) -> str:
    """The training state (weights, optimiser, schedule) of draft `variant` after its draft window
    `window` of epoch `epoch` (the rules' temp file: kept until the next window starts from it);
    wildcard names ("{epoch}") give the output's pattern."""
    return f"{results}/{variant}draft/windows/epoch-{epoch}/window-{window}.pt"


def hidden_states(results: str, epoch: int | str, split: str, shards: Sequence[str]) -> list[str]:
    """The hidden-state files of split `split` of these shards, as extracted in epoch `epoch`."""
    return [f"{results}/hidden_states/epoch-{epoch}/{split}/shard-{k}.safetensors" for k in shards]


@dataclass(frozen=True)
class TrainingWindows:
    """A run's training in plan windows (plan: none without windows): the plan's windows per epoch
    and each draft's windows in them."""

    results: str
    windows: list[list[list[str]]]  # per epoch, per plan window, its shard ids (WindowPlan.windows)
    drafts: Mapping[str, DraftWindows]  # {variant: its draft windows}
    variants: Variants

    @classmethod
    def plan(cls, results: str, windows: EpochWindows, variants: Variants) -> TrainingWindows:
        plain = [[list(shards) for shards in epoch] for epoch in windows]
        return cls(results, plain, drafts_in_windows(plain, variants), variants)

    @cached_property
    def _window_of(self) -> list[dict[str, int]]:
        return [{k: w for w, shards in enumerate(epoch) for k in shards} for epoch in self.windows]

    def window_of(self, epoch: int | str, shard: str) -> int:
        """The plan window that holds shard `shard` in epoch `epoch` (extracts it, trains on it)."""
        return self._window_of[int(epoch)][shard]

    def previous_state(self, epoch: int | str, window: int | str, variant: str = MAIN) -> list[str]:
        """The training state a draft window starts from: the draft's previous window's, the last of
        the previous epoch, or none."""
        previous = self.drafts[variant].previous(int(epoch), int(window))
        return [training_state(self.results, *previous, variant)] if previous else []

    def last_state(self, variant: str = MAIN) -> str:
        """The training state after a draft's last window of the last epoch."""
        return training_state(self.results, *self.drafts[variant].last(), variant)

    def trained(self, epoch: int, plan_window: int) -> list[str]:
        """The training states of every draft's window that reads plan window `plan_window` of epoch
        `epoch`: once they exist, nothing reads its states any more."""
        states = []
        for variant, windows in self.drafts.items():
            reading = windows.reading(epoch, plan_window)
            if reading is not None:
                states.append(training_state(self.results, epoch, reading, variant))
        return states

    def extraction_gate(self, epoch: int | str, shard: str) -> list[str] | None:
        """What extracting shard `shard` in epoch `epoch` waits for: every draft that reads the plan
        window before its own trained on it (and its states are deleted), so the disk never holds two
        plan windows; None for the first plan window of the run (it waits for the plan's check alone)."""
        previous = self.drafts[MAIN].previous(int(epoch), self.window_of(epoch, shard))
        return self.trained(*previous) if previous else None

    def draft_window_shards(self, variant: str, epoch: int | str, window: int | str) -> list[str]:
        """The shard entries a draft window reads (a learning-curve point's may repeat a shard)."""
        return self.drafts[variant].shards(int(epoch), int(window))

    def window_states(self, split: str, variant: str, epoch: int | str, window: int | str) -> list[str]:
        """The hidden states of split `split` a draft window reads (its epoch's, of its shard entries,
        in order): none of the validation split for a learning-curve point (it records no validation
        figures, as without a cap)."""
        if split == "validation" and self.variants.is_point(variant):
            return []
        return hidden_states(self.results, epoch, split, self.draft_window_shards(variant, epoch, window))

    def validation_states(self) -> list[str]:
        """What offline validation reads: the main draft's last window's validation states (still on
        disk: validation is their last reader)."""
        epoch, window = self.drafts[MAIN].last()
        return hidden_states(self.results, epoch, "validation", self.drafts[MAIN].shards(epoch, window))
