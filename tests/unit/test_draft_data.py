"""Token-budget batches over the memory-mapped hidden-state shards."""

from __future__ import annotations

import torch

from eagle3_pipeline.draft import data as data_module
from eagle3_pipeline.draft.data import HiddenStateData, plan_batches, rank_batches
from eagle3_pipeline.hidden_states.storage import HiddenStateShard


def test_batches_cover_every_sample_once_within_the_budget():
    lengths = [int(n) for n in torch.randint(1, 50, (200,), generator=torch.Generator().manual_seed(0))]
    batches = plan_batches(lengths, batch_tokens=128, seed=3, epoch=1)
    assert sorted(i for b in batches for i in b) == list(range(200))
    assert all(len(b) * max(lengths[i] for i in b) <= 128 for b in batches)
    assert plan_batches(lengths, 128, seed=3, epoch=1) == batches  # deterministic
    assert plan_batches(lengths, 128, seed=3, epoch=2) != batches  # reshuffled each epoch


def test_processes_get_disjoint_equal_shares():
    batches = [[i] for i in range(11)]
    shares = [rank_batches(batches, r, 3) for r in range(3)]
    assert [len(s) for s in shares] == [3, 3, 3]
    flat = [b[0] for s in shares for b in s]
    assert len(set(flat)) == 9


def test_collate_pads_whole_samples(draft_hidden_states):
    path = draft_hidden_states["train"][0]
    data = HiddenStateData([path], batch_tokens=256)
    indices = data.batches(seed=0, epoch=0)[0]
    batch = data.collate(indices)
    longest = max(data.samples[i].length for i in indices)
    assert batch.input_ids.shape == (len(indices), longest)
    assert batch.aux_hidden_states.shape == (len(indices), longest, 3 * 64)
    with HiddenStateShard(path) as shard:
        for row, i in enumerate(indices):
            sample = shard[data.samples[i].index]
            n = len(sample["input_ids"])
            assert torch.equal(batch.input_ids[row, :n], sample["input_ids"].long())
            assert torch.equal(batch.final_hidden_states[row, :n], sample["final_hidden_states"])
            assert not batch.loss_mask[row, n:].any() and bool(batch.has_final[row, :n].all())


def test_long_samples_are_cut_to_the_budget(draft_hidden_states):
    data = HiddenStateData(draft_hidden_states["train"], batch_tokens=16)
    assert max(s.length for s in data.samples) == 16
    assert data.collate([0]).input_ids.shape[1] <= 16


def test_at_most_max_open_shards_are_held_open(draft_hidden_states, monkeypatch):
    monkeypatch.setattr(data_module, "MAX_OPEN_SHARDS", 1)
    paths = draft_hidden_states["train"]
    data = HiddenStateData(paths, batch_tokens=256)
    first = next(i for i, s in enumerate(data.samples) if s.shard == 0)
    second = next(i for i, s in enumerate(data.samples) if s.shard == 1)
    a = data.collate([first])
    data.collate([second])
    assert list(data._open) == [1]
    assert torch.equal(data.collate([first]).aux_hidden_states, a.aux_hidden_states)  # reopened
    assert list(data._open) == [0]
