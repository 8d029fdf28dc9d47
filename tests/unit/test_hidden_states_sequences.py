"""Sequences and loss masks from trace rows: server ids, template rebuild, overlong policies, batching."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from support.hidden_states import KIMI_STYLE_TEMPLATE, trace_rows, write_traces

from eagle3_pipeline.hidden_states import sequences as seq
from eagle3_pipeline.hidden_states.sequences import SequenceError, SequenceStats, TrainingSequence
from eagle3_pipeline.target_shape import vllm_layer_ids


@pytest.fixture
def kimi_tokenizer(hs_tokenizer):
    """The target tokenizer with the Kimi-style test template (the demo's may differ in details)."""
    tokenizer = copy.deepcopy(hs_tokenizer)
    tokenizer.chat_template = KIMI_STYLE_TEMPLATE
    return tokenizer


def test_auto_layers_follow_eagle3_in_both_numberings():
    assert seq.resolve_layers("auto", 8) == [1, 3, 4]
    assert seq.resolve_layers(["auto"], 61) == [1, 29, 57]  # Kimi-K2.5
    assert vllm_layer_ids([1, 29, 57]) == [2, 30, 58]  # vLLM: input to layer l+1
    assert vllm_layer_ids(seq.resolve_layers("auto", 32)) == [2, 16, 29]  # (2, N//2, N-3)


def test_explicit_layers_are_sorted_and_checked():
    assert seq.resolve_layers(["5", "1", "3"], 8) == [1, 3, 5]
    for bad in ([1, 1, 3], [1, 3], [1, 3, 8], ["x", 1, 2]):
        with pytest.raises(SequenceError, match="hidden_states.layers"):
            seq.resolve_layers(bad, 8)
    with pytest.raises(SequenceError, match=">= 5 decoder layers"):
        seq.resolve_layers("auto", 4)


def test_loss_mask_covers_exactly_the_completion(hs_tokenizer):
    row = trace_rows(hs_tokenizer, 1)[0]
    s = seq.sequence_from_ids(row)
    n_prompt = len(row["prompt_token_ids"])
    assert s.input_ids == row["prompt_token_ids"] + row["completion_token_ids"]
    assert s.loss_mask == [0] * n_prompt + [1] * len(row["completion_token_ids"])
    masked = [t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if m]
    text = hs_tokenizer.decode(masked)
    assert row["reasoning"].strip() in text and "</think>" in text and row["content"] in text
    assert row["question"] not in text


def test_template_rebuild_matches_server_ids(kimi_tokenizer):
    rows = trace_rows(kimi_tokenizer, 4)
    expected = [seq.sequence_from_ids(r) for r in rows]
    rows[1]["prompt_token_ids"], rows[1]["completion_token_ids"] = None, None
    rows[3]["completion_token_ids"] = []
    got, stats = seq.build_sequences(rows, 4096, "truncate", lambda: kimi_tokenizer)
    assert stats.rebuilt_from_template == 2
    assert [g.rebuilt for g in got] == [False, True, False, True]
    for g, e in zip(got, expected, strict=True):
        assert (g.input_ids, g.loss_mask) == (e.input_ids, e.loss_mask)


def test_template_rebuild_with_the_targets_own_template(hs_tokenizer):
    row = dict(trace_rows(hs_tokenizer, 1)[0], prompt_token_ids=None, completion_token_ids=None)
    row["system"] = "You are helpful."
    s = seq.sequence_from_template(row, hs_tokenizer)
    trained = hs_tokenizer.decode([t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if m])
    prompt = hs_tokenizer.decode([t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if not m])
    assert row["reasoning"].strip() in trained and row["content"] in trained
    assert row["question"] in prompt and "You are helpful." in prompt
    assert s.loss_mask == sorted(s.loss_mask)  # one prompt part, then one completion part


def test_rebuild_keeps_thinking_when_the_template_drops_it(kimi_tokenizer):
    kimi_tokenizer.chat_template = KIMI_STYLE_TEMPLATE.replace("loop.last and m.reasoning_content", "false")
    row = dict(trace_rows(kimi_tokenizer, 1)[0], prompt_token_ids=None, completion_token_ids=None)
    s = seq.sequence_from_template(row, kimi_tokenizer)
    trained = kimi_tokenizer.decode([t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if m])
    assert row["reasoning"].strip() in trained and "</think>" in trained


def test_rebuild_without_template_names_the_fix(kimi_tokenizer):
    row = dict(trace_rows(kimi_tokenizer, 1)[0], prompt_token_ids=None, completion_token_ids=None)
    kimi_tokenizer.chat_template = None
    with pytest.raises(SequenceError, match="chat template"):
        seq.build_sequences([row], 4096, "truncate", lambda: kimi_tokenizer)


def test_tokenizer_is_loaded_only_when_a_row_needs_it(hs_tokenizer):
    def fail():
        raise AssertionError("tokenizer loaded although every row has ids")

    got, stats = seq.build_sequences(trace_rows(hs_tokenizer, 3), 4096, "truncate", fail)
    assert len(got) == 3 and stats.rebuilt_from_template == 0


def _long(n_prompt: int, n_completion: int, sid: str = "a") -> TrainingSequence:
    return TrainingSequence(sid, list(range(n_prompt + n_completion)), [0] * n_prompt + [1] * n_completion)


def test_overlong_truncate_keeps_the_head_and_counts():
    stats = SequenceStats()
    out = seq.apply_length_policy(_long(10, 30), 16, "truncate", stats)
    assert out.input_ids == list(range(16)) and out.loss_mask == [0] * 10 + [1] * 6
    assert (stats.truncated, stats.dropped) == (1, 0)
    assert seq.apply_length_policy(_long(3, 3), 16, "truncate", stats).input_ids == list(range(6))
    assert stats.truncated == 1


def test_overlong_drop_and_prompt_only_truncation_drop():
    stats = SequenceStats()
    assert seq.apply_length_policy(_long(10, 30, "x"), 16, "drop", stats) is None
    assert seq.apply_length_policy(_long(20, 5, "y"), 16, "truncate", stats) is None  # nothing left to learn
    assert (stats.truncated, stats.dropped, stats.dropped_ids) == (0, 2, ["x", "y"])


def test_overlong_policies_through_build_sequences(hs_tokenizer):
    rows = trace_rows(hs_tokenizer, 6)
    limit = sorted(len(r["prompt_token_ids"]) + len(r["completion_token_ids"]) for r in rows)[2]
    kept, stats = seq.build_sequences(rows, limit, "drop", lambda: None)
    assert all(len(s) <= limit for s in kept) and stats.dropped == 6 - len(kept) > 0
    kept, stats = seq.build_sequences(rows, limit, "truncate", lambda: None)
    assert len(kept) == 6 and stats.truncated > 0 and max(map(len, kept)) == limit
    with pytest.raises(SequenceError, match="overlong"):
        seq.build_sequences(rows, limit, "clip", lambda: None)


def test_failed_rows_are_skipped_and_duplicates_refused(hs_tokenizer):
    rows = trace_rows(hs_tokenizer, 3)
    rows[0]["status"] = "failed"
    got, stats = seq.build_sequences(rows, 4096, "truncate", lambda: None)
    assert [s.id for s in got] == [rows[1]["id"], rows[2]["id"]] and stats.skipped_status == 1
    with pytest.raises(SequenceError, match="twice"):
        seq.build_sequences([rows[1], rows[1]], 4096, "truncate", lambda: None)


def test_load_trace_rows_takes_one_shard_in_file_order(hs_tokenizer, tmp_path: Path):
    rows = trace_rows(hs_tokenizer, 3, shard=1) + trace_rows(hs_tokenizer, 2, shard=0, start=3)
    path = write_traces(tmp_path / "train.parquet", rows[:2] + rows[3:] + rows[2:3])
    assert [r["id"] for r in seq.load_trace_rows(path, 1)] == ["id0000", "id0001", "id0002"]
    assert seq.load_trace_rows(path, 7) == []
    write_traces(tmp_path / "bad.parquet", [{k: v for k, v in r.items() if k != "shard"} for r in rows])
    with pytest.raises(SequenceError, match="shard"):
        seq.load_trace_rows(tmp_path / "bad.parquet", 0)


@pytest.mark.parametrize("budget", [1, 50, 100, 1000])
def test_batches_cover_every_sample_once_within_budget(budget):
    lengths = [5, 40, 17, 33, 8, 90, 1, 12, 60, 25]
    batches = seq.longest_first_batches(lengths, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= budget
    assert seq.longest_first_batches([], budget) == []
