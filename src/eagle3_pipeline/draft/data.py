"""Batches of whole samples under a token budget, read memory-mapped from the hidden-state shards.

A batch holds whole samples padded to its longest one, with rows x longest <= batch_tokens. The order is
a pure function of (seed, epoch): samples are shuffled, sorted by length inside windows of
SORT_WINDOW (less padding, still random), packed, and the batches shuffled again. Each process of a
distributed run takes every world-th batch, all processes the same count.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle3_pipeline.draft.ttt import Batch
from eagle3_pipeline.hidden_states.storage import HiddenStateShard

log = logging.getLogger(__name__)

SORT_WINDOW = 64
MAX_OPEN_SHARDS = 32


@dataclass(frozen=True)
class SampleRef:
    shard: int
    index: int
    length: int  # tokens used (a sample longer than the batch budget is cut to it)


def plan_batches(lengths: Sequence[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Sample indices grouped into batches of at most batch_tokens padded tokens, in a seeded order."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(lengths), generator=generator).tolist()
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for start in range(0, len(order), SORT_WINDOW):
        for i in sorted(order[start : start + SORT_WINDOW], key=lambda i: lengths[i]):
            length = min(lengths[i], batch_tokens)
            if current and max(longest, length) * (len(current) + 1) > batch_tokens:
                batches.append(current)
                current, longest = [], 0
            current.append(i)
            longest = max(longest, length)
    if current:
        batches.append(current)
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def rank_batches(batches: list[list[int]], rank: int, world: int) -> list[list[int]]:
    """This process's share: every world-th batch, the same number for every process."""
    per_rank = len(batches) // world
    if per_rank == 0 and batches:
        raise ValueError(
            f"{len(batches)} batches for {world} processes: lower train.batch_tokens or add data"
        )
    return batches[rank::world][:per_rank]


class HiddenStateData:
    """The samples of some hidden-state shards. Shards are opened memory-mapped on demand, at most
    MAX_OPEN_SHARDS at a time (thousands of shards would otherwise exhaust the file-handle limit)."""

    def __init__(self, paths: Sequence[str | Path], batch_tokens: int) -> None:
        self.paths = [Path(p) for p in paths]
        self.batch_tokens = batch_tokens
        self.samples: list[SampleRef] = []
        self.final_rows: list[str] = []
        self._open: OrderedDict[int, HiddenStateShard] = OrderedDict()
        cut = 0
        for s, path in enumerate(self.paths):
            with HiddenStateShard(path) as shard:
                self.final_rows.append(shard.metadata.get("final_rows", "all"))
                lengths = shard.offsets.diff().tolist()
            for i, n in enumerate(lengths):
                if n > 0:
                    self.samples.append(SampleRef(s, i, min(n, batch_tokens)))
                cut += n > batch_tokens
        if cut:
            log.warning("%d samples longer than train.batch_tokens=%d are cut to it", cut, batch_tokens)

    def _shard(self, index: int) -> HiddenStateShard:
        if index in self._open:
            self._open.move_to_end(index)
        else:
            self._open[index] = HiddenStateShard(self.paths[index])
            if len(self._open) > MAX_OPEN_SHARDS:
                self._open.popitem(last=False)[1].close()
        return self._open[index]

    def __len__(self) -> int:
        return len(self.samples)

    def batches(self, seed: int, epoch: int, rank: int = 0, world: int = 1) -> list[list[int]]:
        plan = plan_batches([s.length for s in self.samples], self.batch_tokens, seed, epoch)
        return rank_batches(plan, rank, world)

    def collate(self, indices: Sequence[int]) -> Batch:
        """The samples at `indices` padded (zeros, loss_mask 0) to the longest."""
        refs = [self.samples[i] for i in indices]
        longest = max(r.length for r in refs)
        rows = [self._read(r) for r in refs]
        first = rows[0]
        batch = {
            name: torch.zeros(len(refs), longest, *first[name].shape[1:], dtype=first[name].dtype)
            for name in first
        }
        for b, row in enumerate(rows):
            for name, tensor in row.items():
                batch[name][b, : len(tensor)] = tensor
        return Batch(
            input_ids=batch["input_ids"].long(),
            loss_mask=batch["loss_mask"].bool(),
            aux_hidden_states=batch["aux_hidden_states"],
            final_hidden_states=batch["final_hidden_states"],
            has_final=batch["has_final"].bool(),
        )

    def _read(self, ref: SampleRef) -> dict[str, torch.Tensor]:
        sample = {k: v[: ref.length] for k, v in self._shard(ref.shard)[ref.index].items()}
        if self.final_rows[ref.shard] == "loss_mask":
            sample["has_final"] = sample["loss_mask"].bool()
        else:
            sample["has_final"] = torch.ones(ref.length, dtype=torch.bool)
        return sample
