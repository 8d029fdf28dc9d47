"""Offline acceptance: anchors and rightness on hand-built tensors, and the real draft code run over
hidden-state shards written by the target (tests/support/draft.py)."""

import json

import pytest
import torch
from support.validate_models import write_untrained_draft

from eagle3_pipeline.validate.offline import evaluate, greedy_guesses, load_draft, sample_counts


def test_sample_counts_on_a_hand_built_sequence():
    # T = 8, steps = 2: anchors are rows i < 8 - 2 - 1 = 5 with loss_mask[i + 2] set.
    greedy = torch.tensor([10, 11, 12, 13, 14, 15, 16, 17])  # target argmax after row j
    loss_mask = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1])  # anchors: rows 1..4
    guesses = torch.full((2, 8), -1)
    guesses[0, 1], guesses[1, 1] = 12, 13  # row 1: both right (greedy[2], greedy[3])
    guesses[0, 2], guesses[1, 2] = 13, 99  # row 2: step 0 right, step 1 wrong
    guesses[0, 3], guesses[1, 3] = 99, 15  # row 3: step 1 right after a miss: not a prefix
    # row 4: both wrong (-1)
    input_ids = torch.tensor([0, 1, 2, 12, 4, 14, 6, 16])  # sampled trace: x_3, x_5, x_7 are greedy
    counts = sample_counts(guesses, greedy, input_ids, loss_mask, torch.ones(8, dtype=torch.bool))
    assert counts["anchors"] == 4
    assert counts["prefix"] == [2, 1]
    assert counts["step_right"] == [2, 2]
    # completion tokens x_3..x_7, predicted at rows 2..6: the trace took the greedy token 3 times
    assert counts["loss"] == 5 and counts["greedy_agree"] == 3


def test_sample_counts_without_stored_final_states_drops_the_anchor():
    greedy = torch.arange(10, 18)
    guesses = torch.stack([greedy[2:7], greedy[3:8]]).repeat(1, 2)[:, :8]
    has_final = torch.ones(8, dtype=torch.bool)
    has_final[3] = False  # needed by anchor 2 (step 0) and anchor 1 (step 1)
    counts = sample_counts(guesses, greedy, greedy, torch.ones(8), has_final)
    assert counts["anchors"] == 3  # rows 0, 3, 4 of 0..4


def test_sequence_too_short_for_the_steps():
    counts = sample_counts(
        torch.zeros(7, 5, dtype=torch.long),
        torch.zeros(5),
        torch.zeros(5),
        torch.ones(5),
        torch.ones(5, dtype=torch.bool),
    )
    assert counts["anchors"] == 0 and counts["prefix"] == [0] * 7


@pytest.fixture(scope="module")
def untrained(random_target, tmp_path_factory):
    return write_untrained_draft(tmp_path_factory.mktemp("draft"), random_target, draft_vocab_size=64)


def test_guesses_are_causal(untrained, random_target, draft_hidden_states):
    """Row i's chain depends only on rows <= i + 1: the draft sees no future target state."""
    from eagle3_pipeline.hidden_states.storage import HiddenStateShard

    model, d2t = load_draft(untrained, random_target, torch.device("cpu"))
    with HiddenStateShard(draft_hidden_states["validation"][0]) as shard:
        sample = shard[0]
    ids, aux = sample["input_ids"], sample["aux_hidden_states"]
    full = greedy_guesses(model, d2t, ids, aux, 3)
    cut = 9
    part = greedy_guesses(model, d2t, ids[: cut + 2], aux[: cut + 2], 3)
    assert torch.equal(full[:, : cut + 1], part[:, : cut + 1])
    assert int(full.max()) < 64 and int(full.min()) >= 0  # target ids of the 64-token draft vocab


def test_evaluate_untrained_draft(untrained, random_target, draft_hidden_states):
    result = evaluate(untrained, random_target, draft_hidden_states["validation"], steps=3, device="cpu")
    assert result["anchors"] > 0 and result["samples"] == 6
    assert len(result["conditional"]) == len(result["acceptance_length"]) == 3
    assert 1.0 <= result["acceptance_length"][0] <= result["acceptance_length"][-1] <= 4.0
    assert result["acceptance_length"][-1] < 1.5  # random weights: almost never right
    json.dumps(result)  # serialisable as offline.json


def test_wrong_target_is_named(untrained, tmp_path):
    from support.draft import build_random_target

    other = build_random_target(tmp_path / "other", vocab_size=50)
    with pytest.raises(ValueError, match="do not fit"):
        load_draft(untrained, other, torch.device("cpu"))
