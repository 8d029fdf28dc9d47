"""planning.disk_cap: hidden_states.max_disk_gb read from the config when the workflow is parsed (one
shard's bound, a cap below it refused with the numbers, the target's hidden size), each shard sized
from its checked traces where they are up to date, and the check of the parsed plan before a capped
run's first extraction."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from support.disk_cap import capped, kimi_settings

from eagle3_pipeline.planning.disk_cap import (
    budget_record,
    check_window_plan,
    parse_time_hidden_size,
    shards_per_window,
    traced_states,
    window_plan,
    window_sizing,
)
from eagle3_pipeline.planning.state_files import parse_time_state_bytes
from eagle3_pipeline.settings import DemoSettings, TargetSettings
from eagle3_pipeline.state_bytes import DiskBudgetError


def test_a_cap_below_one_shard_is_refused_with_the_numbers():
    with pytest.raises(DiskBudgetError) as error:
        shards_per_window(capped(0.1), 128)
    message = str(error.value)
    assert "hidden_states.max_disk_gb: 0.1 GB (100.00 MB) cannot hold one shard's hidden states" in message
    assert "64 samples x hidden_states.max_seq_len 2,048 tokens x 1,033 B/token" in message
    assert "135.40 MB" in message and "152.32 MB" in message and "at least 0.153" in message


def test_the_kimi_example_plans_the_same_windows_with_or_without_the_weights(tmp_path):
    # planned where the weights are not, a training state file is bounded from the hidden size (an MLP
    # 4 x 7,168 wide: 16.93 GB); with Kimi-K2.5's own shape (text_config) it is 14.29 GB: 34 shards both
    settings = kimi_settings()
    shape = {"hidden_size": 7168, "intermediate_size": 18432, "vocab_size": 163840, "num_attention_heads": 64}
    (tmp_path / "config.json").write_text(json.dumps({"text_config": shape}))
    with_weights = replace(settings, target=replace(settings.target, model=str(tmp_path)))
    assert parse_time_state_bytes(settings, 7168) == 16_934_797_888
    assert parse_time_state_bytes(with_weights, 7168) == 14_292_386_368
    assert shards_per_window(settings, 7168, parse_time_state_bytes(settings, 7168)) == 34
    assert shards_per_window(with_weights, 7168, parse_time_state_bytes(with_weights, 7168)) == 34


def test_hidden_size_at_parse_time_comes_from_the_target_or_the_demo(tmp_path):
    config = capped(1.0)
    assert parse_time_hidden_size(config) == 128  # the demo's target is built later by a rule
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 7168}))
    assert parse_time_hidden_size(replace(config, target=TargetSettings(model=str(tmp_path)))) == 7168
    with pytest.raises(DiskBudgetError, match="point target.model at the target's weights folder") as error:
        parse_time_hidden_size(replace(config, demo=DemoSettings(enabled=False)))
    assert str(error.value).startswith(
        "hidden_states.max_disk_gb (its training windows) needs the target's hidden size, but "
        "target.hidden_size is not set and /absent/config.json does not exist"
    )
    stated = replace(config, demo=DemoSettings(enabled=False), target=TargetSettings("/absent", 7168))
    assert parse_time_hidden_size(stated) == 7168  # no weights here: the config's target.hidden_size
    with pytest.raises(DiskBudgetError, match="target.hidden_size 64 differs from .*config.json's 7168"):
        parse_time_hidden_size(replace(config, target=TargetSettings(str(tmp_path), 64)))


def _record(results: Path, shard: str, total: int, **made_for) -> Path:
    """Shard `shard`'s traces (empty files: only their times count) and then its check_disk_budget record."""
    import os

    for split in ("train", "validation"):
        trace = results / "traces" / "shards" / split / f"shard-{shard}.parquet"
        trace.parent.mkdir(parents=True, exist_ok=True)
        trace.write_bytes(b"")
        os.utime(trace, ns=(10**18, 10**18))
    record = budget_record(results, shard)
    record.parent.mkdir(parents=True, exist_ok=True)
    made = {"hidden_size": 128, "dtype": "bfloat16", "max_seq_len": 2048, "overlong": "truncate"}
    record.write_text(json.dumps({"total_bytes": total, **made, **made_for}))
    os.utime(record, ns=(10**18 + 1, 10**18 + 1))
    return record


def test_traced_states_read_only_up_to_date_records(tmp_path):
    import os

    sizing = window_sizing(capped(1.0), 128)
    shards = [f"{k:05d}" for k in range(6)]
    for k in shards[:5]:
        _record(tmp_path, k, 1000 + int(k))
    legacy = budget_record_of(tmp_path, shards[1])  # a record from before max_seq_len was written
    legacy.write_text(json.dumps({"total_bytes": 1001, "hidden_size": 128, "dtype": "bfloat16"}))
    os.utime(legacy, ns=(10**18 + 1, 10**18 + 1))
    _record(tmp_path, shards[2], 1002, max_seq_len=1024)  # made for another max_seq_len
    _record(tmp_path, shards[3], 1003, hidden_size=64)  # for another target
    stale = tmp_path / "traces" / "shards" / "validation" / f"shard-{shards[4]}.parquet"
    os.utime(stale, ns=(10**18 + 2, 10**18 + 2))  # traces rewritten after the check
    # shard 5 has no record at all
    assert traced_states(tmp_path, shards, sizing) == {"00000": 1000, "00001": 1001}


def budget_record_of(results: Path, shard: str) -> Path:
    return budget_record(results, shard)


def test_the_plan_sizes_checked_shards_from_their_traces(tmp_path):
    config = capped(0.6)  # 8 shards at their bound (152 MB each) need windows of 3
    shards = [f"{k:05d}" for k in range(8)]
    before = window_plan(config, 128, shards, tmp_path)
    assert before.source == "config" and before.engine_scopes == 3 * 3
    for k in shards[:4]:
        _record(tmp_path, k, 40_000_000)  # replies far shorter than max_seq_len: 40 MB each
    some = window_plan(config, 128, shards, tmp_path)
    assert some.source == "traces and config" and some.traced == 4 and not some.one_pass
    assert "4 of 8 shards from their traces" in some.describe()
    for k in shards[4:]:
        _record(tmp_path, k, 40_000_000)
    after = window_plan(config, 128, shards, tmp_path)
    part = 16384 * (4 * 128 * 2 + 9)
    assert after.source == "traces" and after.one_pass and after.held_bytes == 8 * 40_000_000 + 4 * part
    assert "every shard fits at once (each shard from its traces)" in after.describe()


def test_the_window_plan_check_confirms_the_parsed_plan_or_asks_for_a_rerun(tmp_path):
    config = capped(0.6)
    shards = [f"{k:05d}" for k in range(8)]
    sizing = window_sizing(config, 128)
    parsed = window_plan(config, 128, shards, tmp_path)  # before the traces: windows at the bound
    for k in shards:
        _record(tmp_path, k, 40_000_000)
    out = tmp_path / "budget" / "window_plan.json"
    with pytest.raises(DiskBudgetError) as error:  # the traces hold every shard at once: a rerun
        check_window_plan(parsed.windows, sizing, shards, tmp_path, out)
    message = str(error.value)
    assert "planned, when the workflow was parsed, as 9 windows over 3 epochs (9 engine starts" in message
    assert "now plan one extraction pass (1 engine start)" in message and "run snakemake again" in message
    assert not out.exists()
    reparsed = window_plan(config, 128, shards, tmp_path)  # the next run's plan: from the traces
    checked = check_window_plan(reparsed.windows, sizing, shards, tmp_path, out)
    assert checked.one_pass and json.loads(out.read_text())["one_pass"] is True
    left = tmp_path / "hidden_states" / "epoch-0" / "train" / "shard-00003.safetensors"
    left.parent.mkdir(parents=True)
    left.write_bytes(b"x")  # a window's states left by an earlier windowed plan: not in the cap
    with pytest.raises(DiskBudgetError, match="1 hidden-state files extracted in windows, per epoch"):
        check_window_plan(reparsed.windows, sizing, shards, tmp_path, out)
