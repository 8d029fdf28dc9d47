"""The draft variants ({variant}): the main draft, the baseline, the learning-curve points; which
shards each trains on, whose hidden states it reads and where its export's inputs are.

"" is the main draft, trained on the target's own traces (results/RUN/draft/ etc.); "baseline/"
(validate.baseline) the same rules on the dataset's original answers (results/RUN/baseline/);
validate.learning_curve adds the main draft's rules again on its first k training shards (nested
subsets of the stable order, on the main draft's hidden states), as learning_curve/shards-{k}/. k =
every shard is the main draft itself. A point trains as many optimizer steps as the main draft: its
epoch reads its k shards cycled to the main draft's entries (train_shards).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TypeVar

from eagle3_pipeline.settings import Settings

MAIN = ""
BASELINE = "baseline/"
CURVE_PREFIX = "learning_curve/shards-"  # a learning-curve point's {variant}: CURVE_PREFIX{k:05d}/

T = TypeVar("T")


def curve_points(fractions: Sequence[float], shards: int) -> dict[int, list[float]]:
    """Training shards per point -> the fractions that asked for it: k = ceil(fraction x shards), at
    least 1 (fractions that round to the same k are one point). Empty without fractions.

    Raises:
        ValueError: a fraction outside (0, 1].
    """
    points: dict[int, list[float]] = {}
    for fraction in fractions:
        if not 0 < fraction <= 1:
            raise ValueError(f"validate.learning_curve: {fraction} is not a fraction in (0, 1]")
        k = min(shards, max(1, math.ceil(fraction * shards - 1e-9)))
        points.setdefault(k, []).append(fraction)
    return dict(sorted(points.items()))


def variant_name(k: int, shards: int) -> str:
    """The {variant} of the point trained on k shards: "" (the main draft) for all of them."""
    return "" if k == shards else f"{CURVE_PREFIX}{k:05d}/"


def epoch_entries(num_samples: int, shard_size: int, k: int) -> int:
    """Shard entries in one training epoch of a point of k full shards: the full draft's samples in
    whole shards (num_samples / shard_size to the nearest: a last shard under half full is not one), at
    least k (every shard of the point is read)."""
    return max(k, int(num_samples / shard_size + 0.5))


def cycled_shards(shards: Sequence[T], k: int, entries: int | None = None) -> list[T]:
    """One training epoch of the point on the first k of `shards`: those k cycled to `entries` entries
    (default len(shards); entry i is shard i mod k), so the epoch has about the full draft's batches.
    Each of the k shards is read entries // k or one more time per epoch (equally often when k divides
    entries).

    Raises:
        ValueError: k outside 1..len(shards), or fewer entries than k.
    """
    entries = len(shards) if entries is None else entries
    if not 1 <= k <= min(len(shards), entries):
        raise ValueError(f"a learning-curve point of {k} shards out of {len(shards)} ({entries} per epoch)")
    return [shards[i % k] for i in range(entries)]


@dataclass(frozen=True)
class Variants:
    """The run's draft variants (from_settings): its training shards, the sizes that set a point's
    epoch, whether the baseline is trained, and the learning curve's points {k: fractions asking it}."""

    results: str
    shards: tuple[str, ...]
    num_samples: int
    shard_size: int
    baseline: bool
    curve_points: Mapping[int, list[float]]

    @classmethod
    def from_settings(cls, settings: Settings, shards: Sequence[str], results: str) -> Variants:
        points = curve_points(settings.validate.learning_curve, len(shards))
        dataset, baseline = settings.dataset, settings.validate.baseline
        return cls(results, tuple(shards), dataset.num_samples, dataset.shard_size, baseline, points)

    @cached_property
    def curve(self) -> dict[str, int]:
        """{variant: k} of the learning-curve points trained apart (k below every shard)."""
        n = len(self.shards)
        return {variant_name(k, n): k for k in self.curve_points if k < n}

    @property
    def names(self) -> list[str]:
        """Every variant: the main draft, the baseline if trained, the curve's points."""
        return [MAIN, *([BASELINE] if self.baseline else []), *self.curve]

    def is_point(self, variant: str) -> bool:
        """A learning-curve point: trained on the main draft's states, without validation figures."""
        return variant in self.curve

    def shards_of(self, variant: str) -> list[str]:
        """The training shards of a variant: the first k for a learning-curve point, else all."""
        curve = self.curve
        return list(self.shards[: curve[variant]] if variant in curve else self.shards)

    def epoch_entries(self, k: int) -> int:
        """Shard entries in one training epoch of the point of k shards: the main draft's samples in
        whole shards (a last shard under half full is not one), so the point trains its steps."""
        return epoch_entries(self.num_samples, self.shard_size, k)

    def train_shards(self, variant: str) -> list[str]:
        """What one training epoch of a variant reads: a point's k shards cycled to the main draft's
        entries (about N/k passes: the main draft's steps), else its shards."""
        curve = self.curve
        if variant in curve:
            k = curve[variant]
            return cycled_shards(list(self.shards), k, self.epoch_entries(k))
        return self.shards_of(variant)

    def states_of(self, variant: str) -> str:
        """Whose hidden states a variant trains on: a learning-curve point on the main draft's."""
        return MAIN if self.is_point(variant) else variant

    def export_weights(self, variant: str, selected: bool) -> str:
        """What export_draft ships: the epoch select_checkpoint chose, else the last epoch's weights."""
        return f"{self.results}/{variant}draft/{'selected' if selected else 'trained'}/model.safetensors"

    def export_metadata(self, variant: str, first_epoch_dir: str) -> str:
        """The first training shard's metadata of the states the variant trained on (its layer
        numbering and final-state kind); `first_epoch_dir` the first epoch's folder under hidden_states/
        ("" without windows, else "epoch-0/")."""
        states = f"{self.results}/{self.states_of(variant)}hidden_states"
        return f"{states}/{first_epoch_dir}train/shard-{self.shards[0]}.json"
