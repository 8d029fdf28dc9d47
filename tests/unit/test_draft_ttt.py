"""TTT targets, masks and their shifts on hand-checked tiny cases; loss and metrics."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from eagle3_pipeline.draft.ttt import Batch, step_mask, summarize

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the references

from ttt_reference import target_distribution, ttt_loss  # noqa: E402


def tiny_batch(loss_mask: list[int], has_final: list[int] | None = None) -> Batch:
    n = len(loss_mask)
    return Batch(
        input_ids=torch.arange(n)[None],
        loss_mask=torch.tensor([loss_mask], dtype=torch.bool),
        aux_hidden_states=torch.zeros(1, n, 6),
        final_hidden_states=torch.zeros(1, n, 2),
        has_final=torch.tensor([has_final or [1] * n], dtype=torch.bool),
    )


def test_targets_and_mask_shift_with_each_step():
    # x_0..x_5; completion is x_2..x_4 (x_5 is padding); the target's argmax at position 3 is outside
    # the draft vocabulary. Row i of step k targets position i+1+k and predicts x_{i+2+k}.
    batch = tiny_batch([0, 0, 1, 1, 1, 0])
    in_draft = torch.tensor([[1, 1, 1, 0, 1, 1]], dtype=torch.bool)
    assert step_mask(batch, in_draft, 0)[0].int().tolist() == [1, 1, 0, 0, 0, 0]
    assert step_mask(batch, in_draft, 1)[0].int().tolist() == [1, 0, 0, 0, 0, 0]
    assert step_mask(batch, in_draft, 2)[0].int().tolist() == [
        0,
        0,
        0,
        0,
        0,
        0,
    ]  # row 0 would target position 3


def test_each_step_targets_the_distribution_one_place_further():
    # one-hot targets: position j says draft id j; a draft that answers "row i at step k -> id i+1+k"
    # is right everywhere, one that answers "i+k" (not shifted with the step) is wrong everywhere
    batch = tiny_batch([1] * 6)
    in_draft = torch.ones(1, 6, dtype=torch.bool)
    probs = torch.eye(8)[:6][None]  # [1, 6, 8]
    rows = torch.arange(6)
    shifted = [torch.nn.functional.one_hot((rows + 1 + k) % 8, 8)[None].float() * 20 for k in range(3)]
    unshifted = [torch.nn.functional.one_hot((rows + k) % 8, 8)[None].float() * 20 for k in range(3)]
    assert summarize(ttt_loss(shifted, batch, probs, in_draft, 0.8)[1], 0.8)["step_accuracy"] == [
        1.0,
        1.0,
        1.0,
    ]
    assert summarize(ttt_loss(unshifted, batch, probs, in_draft, 0.8)[1], 0.8)["step_accuracy"] == [
        0.0,
        0.0,
        0.0,
    ]


def test_rows_without_a_stored_final_state_do_not_count():
    batch = tiny_batch([0, 1, 1, 1, 1], has_final=[0, 1, 0, 1, 1])
    in_draft = torch.ones(1, 5, dtype=torch.bool)
    assert step_mask(batch, in_draft, 0)[0].int().tolist() == [1, 0, 1, 0, 0]


def test_target_distribution_is_restricted_to_the_draft_vocabulary():
    lm_head = torch.eye(4, 2)  # logits over a 4-token vocab = first two coordinates, zeros elsewhere
    final = torch.tensor([[[3.0, 0.0], [0.0, -5.0]]])  # argmax ids 0, then one of the zero logits
    t2d = torch.tensor([True, False, True, True])
    ids = torch.tensor([0, 2, 3])
    probs, in_draft = target_distribution(final, lm_head, t2d, ids)
    assert probs.shape == (1, 2, 3)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 2))
    expected = torch.softmax(torch.tensor([3.0, 0.0, 0.0]), 0)
    torch.testing.assert_close(probs[0, 0], expected)
    assert in_draft[0, 0].item() is True
    assert in_draft[0, 1].item() is True  # argmax of [0, -5, 0, 0] is id 0, in the draft vocabulary


def test_loss_is_the_target_entropy_when_the_draft_matches_and_weights_decay():
    torch.manual_seed(0)
    batch = tiny_batch([1] * 6)
    probs = torch.softmax(torch.randn(1, 6, 4), -1)
    in_draft = torch.ones(1, 6, dtype=torch.bool)
    logits = [torch.log(shift_probs) for shift_probs in (probs[:, 1:], probs[:, 2:])]
    logits = [torch.cat([lg, torch.zeros(1, 6 - lg.shape[1], 4)], 1) for lg in logits]
    loss, stats = ttt_loss(logits, batch, probs, in_draft, decay=0.5)
    entropy = -(probs * probs.log()).sum(-1)[0]
    step0, step1 = entropy[1:5].mean(), entropy[2:5].mean()  # rows 0..3 then 0..2 count
    torch.testing.assert_close(loss, step0 + 0.5 * step1)
    summary = summarize(stats, 0.5)
    assert summary["step_accuracy"] == [1.0, 1.0]
    assert summary["simulated_acceptance_length"] == 3.0


def test_conditional_accuracy_counts_rows_whose_earlier_steps_were_right():
    batch = tiny_batch([1] * 5)
    in_draft = torch.ones(1, 5, dtype=torch.bool)
    probs = torch.zeros(1, 5, 2)
    probs[..., 0] = 1.0  # the target always says draft id 0
    right, wrong = torch.tensor([5.0, 0.0]), torch.tensor([0.0, 5.0])
    step0 = torch.stack([right, wrong, right, wrong, wrong])[None]  # rows 0..2 count at step 0
    step1 = torch.stack([right, right, wrong, wrong, wrong])[None]  # rows 0..1 count at step 1
    _, stats = ttt_loss([step0, step1], batch, probs, in_draft, decay=0.8)
    summary = summarize(stats, 0.8)
    assert summary["step_accuracy"] == pytest.approx([2 / 3, 1.0])
    assert summary["conditional_accuracy"] == pytest.approx([2 / 3, 1.0])  # row 0 only: right at step 1
    assert summary["simulated_acceptance_length"] == pytest.approx(1 + 2 / 3 + 2 / 3)
    assert math.isfinite(summary["loss"])
