"""Question-level intervals (validate/intervals.py) and the matched check's paired allowance
(validate/matched.py) on counts whose answers are known."""

from __future__ import annotations

import pytest

from eagle3_pipeline.generate.reply import parse_completion
from eagle3_pipeline.validate.intervals import acceptance_interval, paired_differences
from eagle3_pipeline.validate.matched import compare_matched
from eagle3_pipeline.validate.spec_decode import question_counts


def test_the_interval_brackets_the_figure_and_narrows_with_more_questions():
    rows = [(10, [6, 4, 2]), (20, [10, 5, 1]), (10, [9, 8, 7]), (30, [12, 6, 3])] * 5
    few = acceptance_interval(rows[:4])
    many = acceptance_interval(rows)
    # 1 + 37/70 + 23/70 + 13/70, the pooled counts' acceptance length at k = 3
    assert many["acceptance_length"][-1] == pytest.approx(1 + 73 / 70, abs=1e-4)
    for result in (few, many):
        for value, (low, high) in zip(result["acceptance_length"], result["ci95"], strict=True):
            assert low <= value <= high
    assert many["ci95"][-1][1] - many["ci95"][-1][0] < few["ci95"][-1][1] - few["ci95"][-1][0]
    assert acceptance_interval(rows) == many  # the seed is fixed: the same counts, the same interval
    assert many["questions"] == 20 and many["unit"] == "question" and many["seed"] == 0


def test_one_question_has_no_interval():
    assert acceptance_interval([(10, [5, 2, 1])])["ci95"] == [None, None, None]


def test_a_question_level_interval_is_wider_than_drafts_taken_as_independent():
    """Easy and hard questions (everything or nothing accepted): the drafts of one reply move together,
    so the spread between questions, not the count of drafts, sets the interval."""
    rows = [(100, [90, 80, 70])] * 5 + [(100, [10, 2, 0])] * 5
    result = acceptance_interval(rows)
    low, high = result["ci95"][0]
    rate = 0.5  # position 1: 500 of 1,000 drafts
    binomial_half_width = 1.96 * (rate * (1 - rate) / 1000) ** 0.5
    assert (high - low) / 2 > 5 * binomial_half_width


def test_pairing_cancels_question_difficulty():
    """A served draft a little worse on every question is seen as worse, though the questions' own
    spread is far larger than the gap."""
    replayed = [(100, [90, 80, 70])] * 5 + [(100, [20, 5, 1])] * 5
    served = [(100, [85, 74, 63])] * 5 + [(100, [15, 3, 0])] * 5
    paired = paired_differences(served, replayed)
    assert paired["difference"][0] == pytest.approx(-0.05)
    assert all(high < 0 for _, high in paired["ci95"][:2])  # the gap is real at positions 1 and 2
    assert paired["standard_error"][0] < 0.02


def _served(per_question: dict) -> dict:
    drafts = sum(c["drafts"] for c in per_question.values())
    k = len(next(iter(per_question.values()))["accepted_per_position"])
    accepted = [sum(c["accepted_per_position"][i] for c in per_question.values()) for i in range(k)]
    return {
        "drafts": drafts,
        "per_position_rate": [a / drafts for a in accepted],
        "per_question": per_question,
    }


def test_the_matched_check_pairs_questions_when_the_server_counts_each_reply():
    ids = [f"q{i}" for i in range(10)]
    replayed = [{"drafts": 40, "accepted_per_position": [30, 20, 12]} for _ in ids]
    noisy = ([29, 21, 13], [31, 19, 11])  # the replay's rates on average, question by question around them
    same = _served({q: {"drafts": 40, "accepted_per_position": noisy[i % 2]} for i, q in enumerate(ids)})
    agree = compare_matched(same, replayed, 0.02, ids=ids)
    assert agree["agree"] and agree["allowance"].startswith("paired question bootstrap")
    worse = _served(
        {i: {"drafts": 40, "accepted_per_position": [22, 11, 5]} for i in ids}
    )  # an earlier epoch
    refused = compare_matched(worse, replayed, 0.02, ids=ids)
    assert not refused["agree"] and all(p["ci95"][1] < 0 for p in refused["positions"])
    counters_only = {k: v for k, v in same.items() if k != "per_question"}
    assert compare_matched(counters_only, replayed, 0.02, ids=ids)["allowance"].startswith("binomial")


def test_a_replys_counts_come_from_vllms_per_request_histogram():
    # 4 verify steps: 0, 1, 3 and 2 draft tokens accepted of 3
    spec = {"acceptance_histogram": [1, 1, 1, 1], "num_spec_tokens": 3, "num_draft_tokens": 12}
    assert question_counts(spec) == {"drafts": 4, "accepted_per_position": [3, 2, 1]}
    reply = {
        "choices": [{"message": {"content": "x"}, "finish_reason": "stop", "token_ids": [1, 2]}],
        "prompt_token_ids": [5],
        "metrics": {"speculative_decoding": spec},
    }
    assert parse_completion(reply)["spec_decode"] == spec
    assert "spec_decode" not in parse_completion({k: v for k, v in reply.items() if k != "metrics"})


def test_choosing_the_best_of_equal_epochs_is_optimistic_and_a_clear_winner_is_not():
    import numpy as np

    from eagle3_pipeline.validate.intervals import selection_optimism

    rng = np.random.default_rng(1)

    def epoch(rate: float) -> list[tuple[int, list[int]]]:  # 30 questions, 20 drafts each
        rows = []
        for _ in range(30):
            first = int(rng.binomial(20, rate))
            rows.append((20, [first, int(rng.binomial(first, rate)), 0]))
        return rows

    ties = selection_optimism([epoch(0.5) for _ in range(8)], k=2)
    assert ties["optimism"] > 0.02 and ties["questions"] == 30  # the best of 8 equals looks better
    clear = selection_optimism([epoch(0.2), epoch(0.8)], k=2)
    assert abs(clear["optimism"]) < 0.01  # the same epoch wins every resample: no selection effect
    assert selection_optimism([epoch(0.5)], k=2)["optimism"] == 0.0


def test_no_question_gives_no_figure_and_no_interval():
    assert acceptance_interval([]) == {
        "acceptance_length": [], "ci95": [], "questions": 0, "draws": 2000, "seed": 0, "unit": "question"
    }  # fmt: skip
