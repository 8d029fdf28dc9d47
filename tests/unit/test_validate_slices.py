"""Acceptance by slice, the served run replayed along a trace, and the matched comparison's allowance, on
hand-built tensors (validate/slices.py, validate/matched.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from eagle3_pipeline.validate.matched import compare_matched
from eagle3_pipeline.validate.slices import (
    answer_start,
    bucket_names,
    check_boundaries,
    replay,
    slice_counts,
    special_token_ids,
)

THINK = {"<think>": 8, "</think>": 9}


def test_bucket_names_and_bad_boundaries():
    assert bucket_names([512, 2048, 8192]) == ["0-512", "512-2048", "2048-8192", "8192+"]
    with pytest.raises(ValueError, match="validate.context_buckets"):
        check_boundaries([512, 512])


def test_answer_starts_after_the_replys_think_end():
    ids = torch.tensor([1, 8, 2, 3, 9, 4, 5])  # prompt [1, <think>], reply 2 3 </think> 4 5
    mask = torch.tensor([0, 0, 1, 1, 1, 1, 1])
    assert answer_start(ids, mask, THINK) == 5
    cut = torch.tensor([1, 8, 2, 3, 4])  # thinking cut off by max_tokens: all thinking
    assert answer_start(cut, torch.tensor([0, 0, 1, 1, 1]), THINK) == 5
    off = torch.tensor([1, 8, 9, 4, 5])  # thinking off: the prompt closed the block, all answer
    assert answer_start(off, torch.tensor([0, 0, 0, 1, 1]), THINK) == 3
    assert answer_start(ids, mask, {}) is None  # a tokenizer without think tokens: no split


def test_slices_by_context_bucket_and_part():
    right = np.array([[1, 1], [1, 0], [0, 1], [1, 1]], dtype=bool)
    rows = np.array([0, 1, 2, 3])  # first guesses at tokens 2, 3, 4, 5
    counts = slice_counts(right, rows, [4], answer_from=4)
    assert counts["context 0-4"] == {"anchors": 2, "prefix": [2, 1]}
    assert counts["context 4+"] == {"anchors": 2, "prefix": [1, 1]}
    assert counts["thinking"] == counts["context 0-4"] and counts["answer"] == counts["context 4+"]
    assert "thinking" not in slice_counts(right, rows, [4], answer_from=None)


def test_replay_walks_the_trace_as_vllm_drafts():
    # prompt 0..1, reply from index 2; guesses[j, i] guess token i + 2 + j
    ids = torch.tensor([5, 6, 10, 11, 12, 13, 14, 15, 16, 17])
    mask = torch.tensor([0, 0, 1, 1, 1, 1, 1, 1, 1, 1])
    guesses = torch.full((2, 10), -1)
    guesses[:, 1] = torch.tensor([11, 99])  # first draft (row 1): 1 accepted, then token 12 from the target
    guesses[:, 3] = torch.tensor([13, 14])  # next draft at row 1 + 1 + 1 = 3: both accepted
    guesses[:, 6] = torch.tensor(
        [99, 17]
    )  # row 3 + 2 + 1 = 6: none accepted; row 7 has no room for 2 guesses
    assert replay(guesses, ids, mask, 2, None) == {"drafts": 3, "accepted_per_position": [2, 1]}
    # max_tokens 4: the reply holds 3 tokens after the first draft (one more draft), 6 after the second
    assert replay(guesses, ids, mask, 2, 4) == {"drafts": 2, "accepted_per_position": [2, 1]}
    assert replay(guesses, ids, mask, 2, 3) == {"drafts": 1, "accepted_per_position": [1, 0]}


def test_replay_accepts_with_the_target_probability_as_vllm_does():
    """A target that writes token 1 with probability 0.7 (else 0) and a draft that always guesses 1:
    vLLM accepts each draft token with p_target = 0.7, so the replay of sampled traces must find about
    0.7, 0.49 and 0.343 of drafts with their first 1, 2, 3 tokens accepted."""
    generator = torch.Generator().manual_seed(0)
    totals = np.zeros(4)
    for _ in range(200):
        reply = (torch.rand(200, generator=generator) < 0.7).long()
        ids = torch.cat([torch.tensor([7, 7]), reply])
        mask = torch.cat([torch.zeros(2, dtype=torch.long), torch.ones(200, dtype=torch.long)])
        counts = replay(torch.ones(3, len(ids), dtype=torch.long), ids, mask, 3, None)
        totals += [counts["drafts"], *counts["accepted_per_position"]]
    assert totals[1:] / totals[0] == pytest.approx([0.7, 0.49, 0.343], abs=0.02)


def test_matched_allowance_is_under_a_tenth_at_demo_size_and_catches_a_collapse():
    replayed = [{"drafts": 40, "accepted_per_position": [24, 16, 12]} for _ in range(25)]  # 1,000 drafts
    same = compare_matched({"drafts": 1000, "per_position_rate": [0.59, 0.41, 0.29]}, replayed, 0.02)
    assert same["agree"] and max(p["allowed"] for p in same["positions"]) <= 0.1
    broken = compare_matched({"drafts": 1000, "per_position_rate": [0.05, 0.0, 0.0]}, replayed, 0.02)
    assert not broken["agree"] and not any(p["agree"] for p in broken["positions"])


def test_matched_check_is_two_sided_served_far_above_the_replay_disagrees():
    """A served figure far above its own replay is as wrong as one far below (a replay of another draft,
    a served run that drafted nothing where the replay did): the check refuses both directions."""
    replayed = [{"drafts": 40, "accepted_per_position": [10, 4, 2]} for _ in range(25)]  # 0.25/0.1/0.05
    above = compare_matched({"drafts": 1000, "per_position_rate": [0.6, 0.4, 0.3]}, replayed, 0.02)
    assert not above["agree"]
    assert all(not p["agree"] and p["difference"] > p["allowed"] for p in above["positions"])
    # just inside the allowance above the replay still agrees: the bound is symmetric, not shifted
    first = above["positions"][0]
    near = compare_matched(
        {"drafts": 1000, "per_position_rate": [0.25 + 0.9 * first["allowed"], None, None]}, replayed, 0.02
    )
    assert near["agree"] and near["positions"][0]["difference"] > 0


def test_special_token_ids_from_either_tokenizer_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": [{"id": 9, "content": "</think>"}]}))
    decoder = {"8": {"content": "<think>"}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    assert special_token_ids(tmp_path) == THINK


def test_the_check_refuses_an_offline_json_without_a_matching_replay():
    from eagle3_pipeline.server.draft_command import ServeCheckError
    from eagle3_pipeline.settings import ValidateSettings
    from eagle3_pipeline.validate.serve_check import matched_questions

    questions = [{"id": "a"}, {"id": "b"}]
    offline = {"served_replay": {"num_speculative_tokens": 3, "max_tokens": 128, "samples": {"b": {}}}}
    three, five = ValidateSettings(num_speculative_tokens=3), ValidateSettings(num_speculative_tokens=5)
    assert matched_questions(questions, offline, three, 128) == [{"id": "b"}]
    with pytest.raises(ServeCheckError, match="max_tokens 64"):
        matched_questions(questions, offline, three, 64)
    with pytest.raises(ServeCheckError, match="rerun validate_offline"):
        matched_questions(questions, offline, five)
    with pytest.raises(ServeCheckError, match="rerun validate_offline"):
        matched_questions(questions, {"anchors": 10}, three)
