"""The hidden-state disk budget: estimates from config and traces, the free-space guard, and what the
cap's plan holds on disk at once."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
import yaml
from safetensors.torch import save_file
from support.disk_cap import KIMI_CONFIG, SCHEMA, capped, kimi_settings

from eagle3_pipeline.budget import (
    Budget,
    budget_at_start,
    check_disk_budget,
    check_free_space,
    estimate_from_settings,
    estimate_from_traces,
    existing_bytes,
    free_bytes,
    main,
    on_disk_at_once,
    tokens_from_lengths,
)
from eagle3_pipeline.config import check_config
from eagle3_pipeline.planning.disk_cap import (
    shard_bound_bytes,
    shard_peak_bytes,
    shards_per_window,
    window_plan,
)
from eagle3_pipeline.planning.state_files import STATE_FILES_AT_ONCE, parse_time_state_bytes
from eagle3_pipeline.settings import Settings, TargetSettings, build_settings, section
from eagle3_pipeline.state_bytes import GB, DiskBudgetError, bytes_per_token, format_bytes
from eagle3_pipeline.target_shape import TargetShape


def _hidden_size(config: dict) -> int:
    return TargetShape.from_json(config).hidden_size


def test_hidden_size_is_read_from_a_vl_wrapper_too():
    assert _hidden_size({"hidden_size": 128}) == 128
    assert _hidden_size({"text_config": {"hidden_size": 7168}}) == 7168
    with pytest.raises(ValueError, match="no hidden_size"):
        _hidden_size({"vocab_size": 3})


def test_config_estimate_caps_each_sample_at_max_seq_len():
    settings = section(
        Settings,
        {
            "dataset": {"path": "d.jsonl", "num_samples": 10},
            "target": {"model": "/absent"},
            "generation": {"max_tokens": 8192},
            "hidden_states": {"max_seq_len": 8000, "dtype": "bfloat16"},
        },
    )
    budget = estimate_from_settings(settings, hidden_size=100, prompt_tokens=512)
    assert (budget.source, budget.samples, budget.tokens) == ("config", 10, 80_000)
    assert budget.total_bytes == 80_000 * (800 + 9)


def test_kimi_example_budget_is_the_documented_figure():
    budget = estimate_from_settings(kimi_settings(), hidden_size=7168)
    # 20,000 samples x min(512 + 8192, 10240) tokens x 57,353 B (docs/cluster.md quotes it)
    assert budget.tokens == 20_000 * 8704
    assert format_bytes(budget.total_bytes) == "9.98 TB"


def test_lengths_are_truncated_or_dropped_like_extraction_does():
    assert tokens_from_lengths([10, 50, 200], max_seq_len=100) == (3, 160)
    assert tokens_from_lengths([10, 50, 200], max_seq_len=100, overlong="drop") == (2, 60)


def _traces(path, rows):
    pl.DataFrame(rows).write_parquet(path)
    return path


def test_trace_estimate_uses_token_ids_then_counts(tmp_path):
    with_ids = _traces(
        tmp_path / "train.parquet",
        {"prompt_token_ids": [[1, 2, 3], [4]], "completion_token_ids": [[5] * 7, [6] * 2]},
    )
    counts_only = _traces(tmp_path / "validation.parquet", {"prompt_tokens": [4], "completion_tokens": [500]})
    budget = estimate_from_traces(
        [with_ids, counts_only], 16, max_seq_len=100, overlong="truncate", dtype="bfloat16"
    )
    assert (budget.source, budget.samples, budget.tokens) == ("traces", 3, 10 + 3 + 100)
    assert budget.total_bytes == 113 * bytes_per_token(16)


def _budget(total: int) -> Budget:
    return Budget("traces", 1, total, 1, "bfloat16", 1, total)


def test_guard_fails_early_with_the_numbers():
    with pytest.raises(DiskBudgetError) as error:
        check_free_space(_budget(2_000_000_000), "results/x", free=1_000_000_000, headroom=0.0)
    message = str(error.value)
    assert "need 2.00 GB" in message and "1.00 GB free" in message and "dataset.num_samples" in message


def test_guard_counts_shards_already_written_and_headroom():
    figures = check_free_space(_budget(1000), "results/x", already=400, headroom=0.5, free=900)
    assert figures == {"estimate": 1000, "already_written": 400, "needed": 900, "free": 900}
    with pytest.raises(DiskBudgetError):
        check_free_space(_budget(1000), "results/x", already=400, headroom=0.5, free=899)


def test_free_and_existing_bytes_on_the_real_filesystem(tmp_path):
    assert 0 < free_bytes(tmp_path / "not" / "made" / "yet") == free_bytes(tmp_path)
    import torch

    (tmp_path / "train").mkdir()
    save_file({"x": torch.zeros(1000, dtype=torch.bfloat16)}, tmp_path / "train" / "shard-00000.safetensors")
    assert existing_bytes(tmp_path) == (tmp_path / "train" / "shard-00000.safetensors").stat().st_size > 2000
    assert existing_bytes(tmp_path / "absent") == 0


def test_check_disk_budget_writes_a_deterministic_estimate(tmp_path):
    traces = [_traces(tmp_path / "t.parquet", {"prompt_token_ids": [[1, 2]], "completion_token_ids": [[3]]})]
    target = tmp_path / "config.json"
    target.write_text(json.dumps({"hidden_size": 128}))
    out = tmp_path / "budget" / "hidden_states.json"
    check_disk_budget(traces, target, tmp_path / "hs", out, max_seq_len=64)
    first = out.read_text()
    check_disk_budget(traces, target, tmp_path / "hs", out, max_seq_len=64)
    assert out.read_text() == first  # unchanged traces: an identical file, nothing downstream reruns
    assert json.loads(first)["total_bytes"] == 3 * (4 * 128 * 2 + 9)


def test_cli_prints_the_kimi_budget_and_says_it_does_not_fit(tmp_path, capsys):
    code = main([str(KIMI_CONFIG), "--hidden-size", "7168", "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert "174,080,000 tokens" in out and "57,353 B" in out and "9.98 TB" in out
    # the example caps the states on disk at 4,100 GB: windows of 34 shards with the two training state
    # files counted (a shard once, plus the part being packed), 4.06 TB of states and 2 x 16.93 GB; no
    # traces checked yet: every shard at its config bound
    assert "windows of at most 34 shards (3 per epoch, each shard at its config bound)" in out
    assert "10 extraction passes" in out
    assert "2 training state files of 16.93 GB" in out
    assert code == (0 if free_bytes(tmp_path) > 4.3e12 else 1)


def test_cli_reads_hidden_size_from_the_target(tmp_path, capsys):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 64}}))
    config = yaml.safe_load(Path(KIMI_CONFIG).read_text())
    config["target"] = {"model": str(target), "hidden_size": None}
    config["dataset"]["num_samples"] = 2
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main([str(path), "--results", str(tmp_path / "results")]) == 0
    assert "per token: 4 states x 64 x bfloat16" in capsys.readouterr().out
    config["target"] = {"model": str(tmp_path / "absent"), "hidden_size": 7168}  # no weights: the config's
    path.write_text(yaml.safe_dump(config))
    assert main([str(path), "--results", str(tmp_path / "results")]) == 0
    assert "per token: 4 states x 7,168 x bfloat16" in capsys.readouterr().out
    config["target"]["hidden_size"] = None  # neither: the key and the file looked for are named
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as exit_:
        main([str(path)])
    assert str(exit_.value) == (
        f"the disk budget needs the target's hidden size, but target.hidden_size is not set and "
        f"{tmp_path / 'absent' / 'config.json'} does not exist (the target's weights are not on this "
        "machine): set target.hidden_size in the config (the hidden_size in the target's config.json, or "
        "in its text_config), or point target.model at the target's weights folder (or pass --hidden-size)"
    )


def test_a_run_prints_the_upper_bound_as_it_starts(tmp_path, monkeypatch):
    import eagle3_pipeline.budget as budget

    settings = replace(kimi_settings(), target=TargetSettings(model=str(tmp_path / "Kimi-K2.5")))
    assert "not estimated yet" in budget_at_start(settings, tmp_path / "results")  # weights not there yet
    (tmp_path / "Kimi-K2.5").mkdir()
    (tmp_path / "Kimi-K2.5" / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 7168}}))
    monkeypatch.setattr(budget, "free_bytes", lambda path: 20 * 10**12)
    fits = budget_at_start(settings, tmp_path / "results")
    assert "total: 9.98 TB" in fits and "free: 20.00 TB" in fits and "upper bound" in fits
    monkeypatch.setattr(budget, "free_bytes", lambda path: 3 * 10**12)
    short = budget_at_start(settings, tmp_path / "results")  # a warning: the real check comes later
    assert "upper bound does not fit" in short and "3.00 TB free" in short and "check_disk_budget" in short


def test_windows_are_sized_from_the_config_counting_each_shard_once():
    bound = shard_bound_bytes(capped(None), 128)
    assert bound == 64 * 2048 * (4 * 128 * 2 + 9) == 135_397_376  # the demo: one shard's upper bound
    # while it is extracted a shard is on disk once, plus the batch part being moved into it (up to
    # hidden_states.batch_tokens 16,384 tokens): parts are deleted as they are packed
    part = 16384 * (4 * 128 * 2 + 9)
    assert shard_peak_bytes(capped(None), 128) == bound + part == 152_322_048
    assert shards_per_window(capped(None), 128) is None  # no cap: no windows
    assert shards_per_window(capped(2 * bound / GB), 128) == 1
    assert shards_per_window(capped(5 * bound / GB), 128) == 4  # floor((5B - 4 parts) / B): 4 pack slots
    peak, why = on_disk_at_once(capped(5 * bound / GB), estimate_from_settings(capped(None), 128))
    state = parse_time_state_bytes(capped(None), 128)  # the two training state files held at once
    assert peak == 4 * (bound + part) + 2 * state <= 5 * bound and "windows of at most 4 shards" in why
    assert "3 extraction passes" in why


def test_the_kimi_example_cap_holds_windows_of_34_shards():
    config = check_config(yaml.safe_load(Path(KIMI_CONFIG).read_text()), SCHEMA)
    settings = build_settings(config)
    assert settings.hidden_states.max_disk_gb == 4100 and settings.hidden_states.pack_slots == 4
    bound, part = 200 * 10240 * 57353, 32768 * 57353  # 117.46 GB a shard, a 1.88 GB part being packed
    # 34 shards once plus 4 parts (at most hidden_states.pack_slots pack at once): (4,100 - 7.52) / 117.46
    assert shards_per_window(settings, 7168) == 34
    state = parse_time_state_bytes(settings, 7168)  # no weights at hand: the bound from the hidden size
    # with the training state files, as window_sizing checks the cap:
    # (4,100 GB - 2 x 16.93 GB - 7.52 GB) / 117.46 GB
    assert shards_per_window(settings, 7168, state) == 34
    with_4020 = check_config(
        {**config, "hidden_states": {**config["hidden_states"], "max_disk_gb": 4020}}, SCHEMA
    )
    assert shards_per_window(build_settings(with_4020), 7168) == 34  # (4,020 - 7.52) / 117.46 = 34.2
    assert shards_per_window(build_settings(with_4020), 7168, state) == 33  # the state files cost a shard
    peak, _ = on_disk_at_once(settings, estimate_from_settings(settings, 7168))
    assert peak == 34 * bound + 4 * part + 2 * state <= 4100 * GB


def test_the_plan_reserves_min_of_pack_slots_and_shards_parts():
    bound = shard_bound_bytes(capped(None), 128)
    part = 16384 * (4 * 128 * 2 + 9)
    state = parse_time_state_bytes(capped(None), 128)
    shards = [f"{k:05d}" for k in range(8)]  # 512 samples in shards of 64
    cap = (8 * bound + 4 * part + 2 * state) / GB + 1e-6  # every shard, 4 parts: one pass at 4 slots
    plan = window_plan(capped(cap), 128, shards)
    assert plan.one_pass and plan.sizing.pack_slots == 4 and plan.reserve_bytes == 4 * part
    assert plan.held_bytes == 8 * bound + 4 * part and plan.to_json()["pack_slots"] == 4
    peak, why = on_disk_at_once(capped(cap), estimate_from_settings(capped(None), 128), plan)
    assert peak == 8 * bound + 4 * part + 2 * state and "the 4 shards packing at once" in why
    eight = capped(cap, pack_slots=8)  # every shard may pack at once: a part each, windows again
    assert not window_plan(eight, 128, shards).one_pass
    one = window_plan(capped(cap, pack_slots=1), 128, shards)
    assert one.one_pass and one.reserve_bytes == part


def test_a_shard_beyond_the_cap_is_refused_by_its_check(tmp_path):
    traces = [_traces(tmp_path / "t.parquet", {"prompt_token_ids": [[1, 2]], "completion_token_ids": [[3]]})]
    target = tmp_path / "config.json"
    target.write_text(json.dumps({"hidden_size": 128}))
    out = tmp_path / "budget" / "shard-00000.json"
    check_disk_budget(traces, target, tmp_path / "hs", out, max_seq_len=64, max_disk_gb=1e-5)  # 10 kB
    with pytest.raises(DiskBudgetError, match="more than hidden_states.max_disk_gb = 1e-06 GB"):
        check_disk_budget(traces, target, tmp_path / "hs", out, max_seq_len=64, max_disk_gb=1e-6)


def test_the_cap_counts_two_training_state_files():
    shard = shard_peak_bytes(capped(None), 128)  # one shard while extracted: once, plus a part
    state = parse_time_state_bytes(capped(None), 128)  # the demo's draft: 12 B per trained parameter
    assert 5 * 10**6 < state < 7 * 10**6
    assert shards_per_window(capped(2 * shard / GB), 128, state) == 1  # (2P - 2S) / P
    assert shards_per_window(capped((2 * shard + 2 * state + 1) / GB), 128, state) == 2
    with pytest.raises(DiskBudgetError, match="plus 2 training state files"):
        shards_per_window(capped((shard + state) / GB), 128, state)
    config = capped((2 * shard + 2 * state + 1) / GB)
    assert shards_per_window(config, 128, parse_time_state_bytes(config, 128)) == 2
    peak, why = on_disk_at_once(config, estimate_from_settings(capped(None), 128))
    assert peak == 2 * shard + STATE_FILES_AT_ONCE * state <= config.hidden_states.max_disk_gb * GB
    assert "2 training state files" in why


# Windows from the traces: the plan under a cap sizes each shard from its checked
# traces where they exist, and a cap that holds every shard extracts once.


def test_a_cap_that_holds_every_shard_extracts_once():
    bound = shard_bound_bytes(capped(None), 128)
    part = 16384 * (4 * 128 * 2 + 9)  # 4 of them in flight: hidden_states.pack_slots
    shard = 8 * bound + 4 * part  # every shard once, 4 packing at once
    state = parse_time_state_bytes(capped(None), 128)
    shards = [f"{k:05d}" for k in range(8)]  # 512 samples in shards of 64
    holds = window_plan(capped((shard + 2 * state) / GB + 1e-6), 128, shards)
    assert holds.one_pass and holds.windows is None and holds.source == "config"
    assert holds.engine_scopes == 1 and holds.extraction_passes == 1  # 1 start, 1 pass
    assert holds.held_bytes == shard and holds.largest_window == 8
    corpus = estimate_from_settings(capped(None), 128)
    peak, why = on_disk_at_once(capped((shard + 2 * state) / GB + 1e-6), corpus, holds)
    assert peak == shard + 2 * state
    assert "every shard fits at once" in why and "one extraction pass" in why
    short = window_plan(capped((shard + 2 * state - 1) / GB), 128, shards)  # a byte short: windows
    assert not short.one_pass and short.engine_scopes == 3 * 2 and short.extraction_passes == 3  # 7 + 1
    assert window_plan(capped(None), 128, shards) is None  # uncapped: no plan, every shard kept


def test_check_disk_budget_records_what_it_was_made_for(tmp_path):
    traces = [_traces(tmp_path / "t.parquet", {"prompt_token_ids": [[1, 2]], "completion_token_ids": [[3]]})]
    target = tmp_path / "config.json"
    target.write_text(json.dumps({"hidden_size": 128}))
    out = tmp_path / "shard-00000.json"
    check_disk_budget(traces, target, tmp_path / "hs", out, max_seq_len=64, overlong="drop")
    record = json.loads(out.read_text())
    assert (record["hidden_size"], record["dtype"], record["max_seq_len"], record["overlong"]) == (
        128, "bfloat16", 64, "drop")  # fmt: skip
