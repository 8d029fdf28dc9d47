"""The hidden-state disk budget: bytes per token, estimates from config and traces, the free-space guard."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
import yaml
from safetensors.torch import save_file

from eagle3_pipeline.budget import (
    GB,
    Budget,
    DiskBudgetError,
    budget_at_start,
    bytes_per_token,
    check_disk_budget,
    check_free_space,
    estimate_from_settings,
    estimate_from_traces,
    existing_bytes,
    format_bytes,
    free_bytes,
    main,
    on_disk_at_once,
    parse_time_hidden_size,
    parse_time_state_bytes,
    shard_bound_bytes,
    shard_peak_bytes,
    shards_per_window,
    tokens_from_lengths,
)
from eagle3_pipeline.config import check_config
from eagle3_pipeline.settings import DemoSettings, Settings, TargetSettings, build_settings, section
from eagle3_pipeline.target_shape import TargetShape

REPO = Path(__file__).resolve().parents[2]
KIMI_CONFIG = str(REPO / "config" / "examples" / "kimi-k2.5-8gpu.yaml")
SCHEMA = REPO / "config" / "schema.yaml"
DEMO_CONFIG = REPO / "config" / "config.yaml"


def test_bytes_per_token_counts_four_states_plus_id_and_mask():
    assert bytes_per_token(7168) == 4 * 7168 * 2 + 9 == 57353  # Kimi-K2.5, bf16
    assert bytes_per_token(128, "float32") == 4 * 128 * 4 + 9
    with pytest.raises(ValueError, match="unknown hidden_states.dtype 'int8'"):
        bytes_per_token(128, "int8")


def test_an_8k_kimi_sample_costs_about_470_mb():
    assert 8192 * bytes_per_token(7168) == pytest.approx(470e6, rel=0.01)


def _hidden_size(config: dict) -> int:
    return TargetShape.from_json(config).hidden_size


def test_hidden_size_is_read_from_a_vl_wrapper_too():
    assert _hidden_size({"hidden_size": 128}) == 128
    assert _hidden_size({"text_config": {"hidden_size": 7168}}) == 7168
    with pytest.raises(ValueError, match="no hidden_size"):
        _hidden_size({"vocab_size": 3})


def _kimi() -> Settings:
    return build_settings(check_config(yaml.safe_load(Path(KIMI_CONFIG).read_text()), SCHEMA))


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
    budget = estimate_from_settings(_kimi(), hidden_size=7168)
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
    code = main([KIMI_CONFIG, "--hidden-size", "7168", "--results", str(tmp_path)])
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

    settings = replace(_kimi(), target=TargetSettings(model=str(tmp_path / "Kimi-K2.5")))
    assert "not estimated yet" in budget_at_start(settings, tmp_path / "results")  # weights not there yet
    (tmp_path / "Kimi-K2.5").mkdir()
    (tmp_path / "Kimi-K2.5" / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 7168}}))
    monkeypatch.setattr(budget, "free_bytes", lambda path: 20 * 10**12)
    fits = budget_at_start(settings, tmp_path / "results")
    assert "total: 9.98 TB" in fits and "free: 20.00 TB" in fits and "upper bound" in fits
    monkeypatch.setattr(budget, "free_bytes", lambda path: 3 * 10**12)
    short = budget_at_start(settings, tmp_path / "results")  # a warning: the real check comes later
    assert "upper bound does not fit" in short and "3.00 TB free" in short and "check_disk_budget" in short


def _capped(
    cap_gb: float | None, shard_size: int = 64, max_seq_len: int = 2048, pack_slots: int = 4
) -> Settings:
    hidden_states = {"max_seq_len": max_seq_len, "dtype": "bfloat16", "max_disk_gb": cap_gb}
    return section(
        Settings,
        {
            "dataset": {"path": "d.jsonl", "num_samples": 512, "shard_size": shard_size},
            "generation": {"max_tokens": 2048},
            "hidden_states": {**hidden_states, "pack_slots": pack_slots},
            "train": {"epochs": 3},
            "target": {"model": "/absent"},
            "demo": {"enabled": True},
        },
    )


def test_windows_are_sized_from_the_config_counting_each_shard_once():
    bound = shard_bound_bytes(_capped(None), 128)
    assert bound == 64 * 2048 * (4 * 128 * 2 + 9) == 135_397_376  # the demo: one shard's upper bound
    # while it is extracted a shard is on disk once, plus the batch part being moved into it (up to
    # hidden_states.batch_tokens 16,384 tokens): parts are deleted as they are packed
    part = 16384 * (4 * 128 * 2 + 9)
    assert shard_peak_bytes(_capped(None), 128) == bound + part == 152_322_048
    assert shards_per_window(_capped(None), 128) is None  # no cap: no windows
    assert shards_per_window(_capped(2 * bound / GB), 128) == 1
    assert shards_per_window(_capped(5 * bound / GB), 128) == 4  # floor((5B - 4 parts) / B): 4 pack slots
    peak, why = on_disk_at_once(_capped(5 * bound / GB), estimate_from_settings(_capped(None), 128))
    state = parse_time_state_bytes(_capped(None), 128)  # the two training state files held at once
    assert peak == 4 * (bound + part) + 2 * state <= 5 * bound and "windows of at most 4 shards" in why
    assert "3 extraction passes" in why


def test_a_cap_below_one_shard_is_refused_with_the_numbers():
    with pytest.raises(DiskBudgetError) as error:
        shards_per_window(_capped(0.1), 128)
    message = str(error.value)
    assert "hidden_states.max_disk_gb: 0.1 GB (100.00 MB) cannot hold one shard's hidden states" in message
    assert "64 samples x hidden_states.max_seq_len 2,048 tokens x 1,033 B/token" in message
    assert "135.40 MB" in message and "152.32 MB" in message and "at least 0.153" in message


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


def test_a_window_reserves_a_part_for_each_pack_slot_not_each_shard():
    from eagle3_pipeline.budget import cut_windows, pack_reserve, sized_windows

    assert pack_reserve([100] * 10, 7, 4) == 4 * 7  # min(slots, shards) parts
    assert pack_reserve([100] * 3, 7, 4) == 3 * 7
    assert pack_reserve([5, 100, 3, 100], 7, 2) == 7 + 7  # the largest parts in flight: min(part, states)
    assert pack_reserve([5, 3], 7, 4) == 5 + 3  # a part is never more than its shard's states
    shards = [f"{k:05d}" for k in range(10)]
    states = dict.fromkeys(shards, 100)
    # every shard at once: 1,000 B + 4 parts of 7 = 1,028; one part per shard would be 1,070
    assert sized_windows(0, 2, shards, states, 1028, part=7, slots=4) is None
    assert sized_windows(0, 2, shards, states, 1027, part=7, slots=4) is not None  # a byte short
    assert sized_windows(0, 2, shards, states, 1028, part=7, slots=10) is not None  # 10 packing: 1,070
    # windows: the most n with 100 n + 7 min(4, n) <= room
    assert [len(w) for w in cut_windows(shards, states, 528, part=7, slots=4)] == [5, 5]
    assert [len(w) for w in cut_windows(shards, states, 527, part=7, slots=4)] == [4, 4, 2]
    assert [len(w) for w in cut_windows(shards, states, 321, part=7, slots=4)] == [3, 3, 3, 1]
    with pytest.raises(DiskBudgetError, match="shard 00000"):
        cut_windows(shards, states, 106, part=7, slots=4)  # one shard and its part: 107


def test_the_plan_reserves_min_of_pack_slots_and_shards_parts():
    from eagle3_pipeline.budget import window_plan

    bound = shard_bound_bytes(_capped(None), 128)
    part = 16384 * (4 * 128 * 2 + 9)
    state = parse_time_state_bytes(_capped(None), 128)
    shards = [f"{k:05d}" for k in range(8)]  # 512 samples in shards of 64
    cap = (8 * bound + 4 * part + 2 * state) / GB + 1e-6  # every shard, 4 parts: one pass at 4 slots
    plan = window_plan(_capped(cap), 128, shards)
    assert plan.one_pass and plan.sizing.pack_slots == 4 and plan.reserve_bytes == 4 * part
    assert plan.held_bytes == 8 * bound + 4 * part and plan.to_json()["pack_slots"] == 4
    peak, why = on_disk_at_once(_capped(cap), estimate_from_settings(_capped(None), 128), plan)
    assert peak == 8 * bound + 4 * part + 2 * state and "the 4 shards packing at once" in why
    eight = _capped(cap, pack_slots=8)  # every shard may pack at once: a part each, windows again
    assert not window_plan(eight, 128, shards).one_pass
    one = window_plan(_capped(cap, pack_slots=1), 128, shards)
    assert one.one_pass and one.reserve_bytes == part


def test_the_kimi_example_plans_the_same_windows_with_or_without_the_weights(tmp_path):
    # planned where the weights are not, a training state file is bounded from the hidden size (an MLP
    # 4 x 7,168 wide: 16.93 GB); with Kimi-K2.5's own shape (text_config) it is 14.29 GB: 34 shards both
    config = check_config(yaml.safe_load(Path(KIMI_CONFIG).read_text()), SCHEMA)
    settings = build_settings(config)
    shape = {"hidden_size": 7168, "intermediate_size": 18432, "vocab_size": 163840, "num_attention_heads": 64}
    (tmp_path / "config.json").write_text(json.dumps({"text_config": shape}))
    with_weights = replace(settings, target=replace(settings.target, model=str(tmp_path)))
    assert parse_time_state_bytes(settings, 7168) == 16_934_797_888
    assert parse_time_state_bytes(with_weights, 7168) == 14_292_386_368
    assert shards_per_window(settings, 7168, parse_time_state_bytes(settings, 7168)) == 34
    assert shards_per_window(with_weights, 7168, parse_time_state_bytes(with_weights, 7168)) == 34


def test_hidden_size_at_parse_time_comes_from_the_target_or_the_demo(tmp_path):
    config = _capped(1.0)
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


def test_a_shard_beyond_the_cap_is_refused_by_its_check(tmp_path):
    traces = [_traces(tmp_path / "t.parquet", {"prompt_token_ids": [[1, 2]], "completion_token_ids": [[3]]})]
    target = tmp_path / "config.json"
    target.write_text(json.dumps({"hidden_size": 128}))
    out = tmp_path / "budget" / "shard-00000.json"
    check_disk_budget(traces, target, tmp_path / "hs", out, max_seq_len=64, max_disk_gb=1e-5)  # 10 kB
    with pytest.raises(DiskBudgetError, match="more than hidden_states.max_disk_gb = 1e-06 GB"):
        check_disk_budget(traces, target, tmp_path / "hs", out, max_seq_len=64, max_disk_gb=1e-6)


def test_the_cap_counts_two_training_state_files():
    from eagle3_pipeline.budget import STATE_FILES_AT_ONCE

    shard = shard_peak_bytes(_capped(None), 128)  # one shard while extracted: once, plus a part
    state = parse_time_state_bytes(_capped(None), 128)  # the demo's draft: 12 B per trained parameter
    assert 5 * 10**6 < state < 7 * 10**6
    assert shards_per_window(_capped(2 * shard / GB), 128, state) == 1  # (2P - 2S) / P
    assert shards_per_window(_capped((2 * shard + 2 * state + 1) / GB), 128, state) == 2
    with pytest.raises(DiskBudgetError, match="plus 2 training state files"):
        shards_per_window(_capped((shard + state) / GB), 128, state)
    config = _capped((2 * shard + 2 * state + 1) / GB)
    assert shards_per_window(config, 128, parse_time_state_bytes(config, 128)) == 2
    peak, why = on_disk_at_once(config, estimate_from_settings(_capped(None), 128))
    assert peak == 2 * shard + STATE_FILES_AT_ONCE * state <= config.hidden_states.max_disk_gb * GB
    assert "2 training state files" in why


def test_the_kimi_example_state_file_is_the_trained_tensors_and_adamw():
    from eagle3_pipeline.budget import STATE_FILE_OVERHEAD, state_file_bytes

    settings = _kimi()
    kimi = {"hidden_size": 7168, "num_attention_heads": 64, "intermediate_size": 18432, "vocab_size": 163840}
    kimi |= {"kv_lora_rank": 512}
    # fc 3H x H, q/k/v 2H x 8,192 each, o 8,192 x H, MLP 3 x H x 18,432, lm_head 32,000 x H, 4 norms
    parameters = 3 * 7168**2 + 2 * 7168 * 3 * 8192 + 8192 * 7168 + 3 * 7168 * 18432 + 32000 * 7168 + 4 * 7168
    assert state_file_bytes(settings.draft, kimi) == 12 * parameters + STATE_FILE_OVERHEAD  # 14.3 GB
    # no weights: an upper bound
    assert parse_time_state_bytes(settings, 7168) >= state_file_bytes(settings.draft, kimi)


@pytest.mark.parametrize("architecture", ["auto", "llama", "deepseek_mla"])
def test_a_state_file_counts_the_trained_tensors_of_the_drafts_architecture(architecture):
    """On a DeepseekV3 (Kimi) target the draft is MLA (auto) or Llama: each state file is 12 bytes per
    trained parameter of the draft actually built (hidden-state files are the target's, whatever the
    draft)."""
    import torch

    from eagle3_pipeline.budget import STATE_FILE_OVERHEAD, state_file_bytes
    from eagle3_pipeline.draft.config import draft_config_from_target
    from eagle3_pipeline.draft.model import Eagle3Draft
    from eagle3_pipeline.settings import DraftSettings

    kimi = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 64, "vocab_size": 163840}
    kimi |= {"intermediate_size": 18432, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128}
    kimi |= {"qk_rope_head_dim": 64, "v_head_dim": 128, "num_key_value_heads": 64}
    draft = DraftSettings(architecture=architecture)
    config = draft_config_from_target(kimi, draft.draft_vocab_size, architecture=architecture)
    with torch.device("meta"):
        trained = sum(p.numel() for p in Eagle3Draft(config).parameters() if p.requires_grad)
    assert state_file_bytes(draft, kimi) == 12 * trained + STATE_FILE_OVERHEAD
    mla = state_file_bytes(DraftSettings(architecture="deepseek_mla"), kimi)
    assert mla < state_file_bytes(DraftSettings(architecture="llama"), kimi)  # 10.8 against 13.7 GB


# Windows from the traces (issue 37 item 2): the plan under a cap sizes each shard from its checked
# traces where they exist, and a cap that holds every shard extracts once.


def test_equal_shards_give_the_fixed_size_windows():
    from eagle3_pipeline.budget import epoch_order, sized_windows

    shards = [f"{k:05d}" for k in range(10)]
    peaks = dict.fromkeys(shards, 100)
    windows = sized_windows(7, 3, shards, peaks, 399)  # floor(399 / 100) = 3 shards a window
    orders = [epoch_order(7, e, shards) for e in range(3)]  # each epoch's order, cut every 3 shards
    assert windows == [[sorted(order[i : i + 3]) for i in range(0, 10, 3)] for order in orders]
    assert [len(w) for w in windows[0]] == [3, 3, 3, 1]


def test_windows_are_cut_from_each_shards_own_bytes():
    from eagle3_pipeline.budget import epoch_order, sized_windows

    shards = [f"{k:05d}" for k in range(8)]
    peaks = {k: 100 * (1 + i % 3) for i, k in enumerate(shards)}  # 100, 200 or 300 bytes
    windows = sized_windows(0, 4, shards, peaks, 400)
    assert windows is not None and len(windows) == 4
    for epoch, epoch_windows_ in enumerate(windows):
        assert sorted(k for w in epoch_windows_ for k in w) == shards  # every shard once an epoch
        assert all(sum(peaks[k] for k in w) <= 400 for w in epoch_windows_)  # each window fits
        # greedy in the epoch's order: a window ends only where the next shard would not fit
        order = epoch_order(0, epoch, shards)
        starts = [order.index(min(w, key=order.index)) for w in epoch_windows_]
        for w, start in zip(epoch_windows_[:-1], starts[1:], strict=True):
            assert sum(peaks[k] for k in w) + peaks[order[start]] > 400
    assert sized_windows(0, 4, shards, peaks, 300 * 3 + 200 * 3 + 100 * 2) is None  # all fit: one pass
    with pytest.raises(DiskBudgetError, match=r"shard \d{5}: its hidden states take 300 B while extracted"):
        sized_windows(0, 1, shards, peaks, 250)


def test_a_cap_that_holds_every_shard_extracts_once():
    from eagle3_pipeline.budget import window_plan

    bound = shard_bound_bytes(_capped(None), 128)
    part = 16384 * (4 * 128 * 2 + 9)  # 4 of them in flight: hidden_states.pack_slots
    shard = 8 * bound + 4 * part  # every shard once, 4 packing at once
    state = parse_time_state_bytes(_capped(None), 128)
    shards = [f"{k:05d}" for k in range(8)]  # 512 samples in shards of 64
    holds = window_plan(_capped((shard + 2 * state) / GB + 1e-6), 128, shards)
    assert holds.one_pass and holds.windows is None and holds.source == "config"
    assert holds.engine_scopes == 1 and holds.extraction_passes == 1  # 1 start, 1 pass
    assert holds.held_bytes == shard and holds.largest_window == 8
    corpus = estimate_from_settings(_capped(None), 128)
    peak, why = on_disk_at_once(_capped((shard + 2 * state) / GB + 1e-6), corpus, holds)
    assert peak == shard + 2 * state
    assert "every shard fits at once" in why and "one extraction pass" in why
    short = window_plan(_capped((shard + 2 * state - 1) / GB), 128, shards)  # a byte short: windows
    assert not short.one_pass and short.engine_scopes == 3 * 2 and short.extraction_passes == 3  # 7 + 1
    assert window_plan(_capped(None), 128, shards) is None  # uncapped: no plan, every shard kept


def _record(results: Path, shard: str, total: int, **made_for) -> Path:
    """Shard `shard`'s traces (empty files: only their times count) and then its check_disk_budget record."""
    import os

    from eagle3_pipeline.budget import budget_record

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

    from eagle3_pipeline.budget import traced_states, window_sizing

    sizing = window_sizing(_capped(1.0), 128)
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
    from eagle3_pipeline.budget import budget_record

    return budget_record(results, shard)


def test_the_plan_sizes_checked_shards_from_their_traces(tmp_path):
    from eagle3_pipeline.budget import window_plan

    config = _capped(0.6)  # 8 shards at their bound (152 MB each) need windows of 3
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


def test_check_disk_budget_records_what_it_was_made_for(tmp_path):
    traces = [_traces(tmp_path / "t.parquet", {"prompt_token_ids": [[1, 2]], "completion_token_ids": [[3]]})]
    target = tmp_path / "config.json"
    target.write_text(json.dumps({"hidden_size": 128}))
    out = tmp_path / "shard-00000.json"
    check_disk_budget(traces, target, tmp_path / "hs", out, max_seq_len=64, overlong="drop")
    record = json.loads(out.read_text())
    assert (record["hidden_size"], record["dtype"], record["max_seq_len"], record["overlong"]) == (
        128, "bfloat16", 64, "drop")  # fmt: skip


def test_the_window_plan_check_confirms_the_parsed_plan_or_asks_for_a_rerun(tmp_path):
    from eagle3_pipeline.budget import check_window_plan, window_plan, window_sizing

    config = _capped(0.6)
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


def test_each_draft_walks_its_own_windows_and_the_cap_holds_its_state_files():
    from eagle3_pipeline.budget import drafts_trained, state_files_at_once
    from eagle3_pipeline.planning.windows import DraftWindows

    windows = [[["a", "c"], ["b", "d"]], [["c", "d"], ["a", "b"]]]
    main = DraftWindows.main(windows)
    point = DraftWindows.point(windows, ["a", "b", "c", "d"], 2, 4)
    assert [main.count(e) for e in (0, 1)] == [2, 2] and [point.count(e) for e in (0, 1)] == [2, 1]
    assert main.shards(1, 0) == ["c", "d"] and point.shards(1, 0) == ["a", "b", "a", "b"]
    # its only window of epoch 1 shares the plan's second
    assert point.reading(1, 0) is None and point.reading(1, 1) == 0 and main.reading(1, 0) == 0
    # it starts from its own previous window, across epochs, and ends in its own last one
    assert point.previous(0, 0) is None and point.previous(0, 1) == (0, 0) and point.previous(1, 0) == (0, 1)
    assert point.last() == (1, 0) and main.last() == (1, 1)
    assert point.shard_lists() == [[["a", "a"], ["b", "b"]], [["a", "b", "a", "b"]]]

    demo = build_settings(check_config(yaml.safe_load(DEMO_CONFIG.read_text()), SCHEMA))
    assert demo.validate.learning_curve == (0.5, 1.0)  # the point of 2 of 4 shards and the main draft
    assert drafts_trained(demo) == 2 and state_files_at_once(demo) == 4
    alone = replace(demo, validate=replace(demo.validate, learning_curve=()))
    assert drafts_trained(alone) == 1 and state_files_at_once(alone) == 2
