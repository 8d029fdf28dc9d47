"""The draft vocabulary map: selection, d2t / t2d, and the file written from shard metadata."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from eagle3_pipeline.draft.vocab import (
    build_vocab_map,
    draft_ids,
    load_vocab_map,
    select_draft_ids,
    vocab_map,
)


def test_most_frequent_ids_sorted_ascending_ties_to_the_lower_id():
    counts = Counter({5: 10, 2: 10, 7: 3, 1: 1})
    used = select_draft_ids(counts, target_vocab_size=10, draft_vocab_size=3)
    assert used.tolist() == [2, 5, 7]
    d2t, t2d = vocab_map(used, 10)
    assert d2t.dtype == torch.int64 and d2t.tolist() == [2, 4, 5]
    assert t2d.dtype == torch.bool and t2d.nonzero().flatten().tolist() == [2, 5, 7]
    assert draft_ids(d2t).tolist() == [2, 5, 7]


def test_a_target_vocabulary_smaller_than_the_draft_is_kept_whole():
    used = select_draft_ids(Counter({3: 1}), target_vocab_size=4, draft_vocab_size=32000)
    assert used.tolist() == [0, 1, 2, 3]
    d2t, t2d = vocab_map(used, 4)
    assert d2t.tolist() == [0, 0, 0, 0] and bool(t2d.all())


def test_unseen_ids_fill_a_draft_vocabulary_that_counts_cannot():
    assert select_draft_ids(Counter({3: 5}), target_vocab_size=10, draft_vocab_size=3).tolist() == [0, 1, 3]


def test_ids_outside_the_target_vocabulary_are_an_error():
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        select_draft_ids(Counter({12: 1}), target_vocab_size=10, draft_vocab_size=3)


def test_vocab_map_file_from_shard_metadata(draft_hidden_states, tmp_path):
    metadata = [p.with_suffix(".json") for p in draft_hidden_states["train"]]
    build_vocab_map(
        metadata, target_vocab_size=96, draft_vocab_size=40, output=tmp_path / "vocab.safetensors"
    )
    d2t, t2d = load_vocab_map(tmp_path / "vocab.safetensors")
    assert len(d2t) == 40 and int(t2d.sum()) == 40
    used = draft_ids(d2t)
    assert torch.equal(t2d.nonzero().flatten(), used) and bool((used.diff() > 0).all())


def test_metadata_without_token_counts_names_the_fix(tmp_path):
    (tmp_path / "shard-00000.json").write_text("{}")
    with pytest.raises(ValueError, match="extract_hidden_states"):
        build_vocab_map([tmp_path / "shard-00000.json"], 96, 40, tmp_path / "v.safetensors")
