"""`make cost`: the extraction plan's counts and GPU hours from a config alone (issue 22), no vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from support.traces import checked_traces

from eagle3_pipeline.config import check_config
from eagle3_pipeline.hidden_states import cost
from eagle3_pipeline.planning.state_files import parse_time_state_bytes
from eagle3_pipeline.settings import Settings, build_settings

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "config" / "schema.yaml"
KIMI = REPO / "config" / "examples" / "kimi-k2.5-8gpu.yaml"


def _settings(path: Path, **changes: dict) -> Settings:
    raw = yaml.safe_load(path.read_text())
    for section, values in changes.items():
        raw[section] = {**raw.get(section, {}), **values}
    return build_settings(check_config(raw, SCHEMA))


def test_the_kimi_example_prints_the_expected_plan_beside_the_bound(capsys, tmp_path):
    assert cost.main([str(KIMI), "--results", str(tmp_path)]) == 0  # no traces checked there
    out = json.loads(capsys.readouterr().out)  # one JSON object
    # the bound: every shard at 200 x 10,240 tokens, windows of 34: 10 epochs x 3 windows (per shard: 1,000)
    assert out["engine_starts_bound"] == 30 and out["extraction_passes_bound"] == 10
    assert out["plan_bound"]["window_shards"] == 34 and out["plan_bound"]["extraction_jobs"] == 1000
    assert out["tokens_bound"] == 10 * 20000 * 8704  # every sample at min(512 + 8192, max_seq_len)
    # the plan, labelled an estimate: completions of 3,000 tokens make a shard 200 x 3,512 x 57,353 B =
    # 40.28 GB; the corpus (4.03 TB) and a 1.88 GB part for each of the 4 shards packing at once
    # (hidden_states.pack_slots), 4.04 TB, fit the 4,066 GB that 4,100 GB leaves beside 2 state files:
    # one pass, 1 engine start (a part for each of the 100 shards, 0.19 TB more, did not fit: 20 starts)
    assert out["plan_source"] == "expected" and "estimate" in out["plan_basis"]
    assert "every completion 3,000 tokens" in out["plan_basis"]
    assert out["engine_starts"] == 1 and out["extraction_passes"] == 1
    assert out["plan"]["one_pass"] and out["plan"]["extraction_jobs"] == 100
    assert out["tokens"] == 20000 * 3512
    for peak in (out["disk_peak_bytes"], out["disk_peak_bytes_bound"]):
        assert peak <= 4100 * 10**9 + out["staging_bytes"]
    assert 0 < out["gpu_hours_low"] < out["gpu_hours_high"]
    low, high = out["assumptions"], out["assumptions"]
    expected = 8 * (1 * low["start_s_fast"] + out["tokens"] / low["tokens_per_s_fast"]) / 3600
    assert out["gpu_hours_low"] == round(expected, 1)
    expected = 8 * (30 * high["start_s_slow"] + out["tokens_bound"] / high["tokens_per_s_slow"]) / 3600
    assert out["gpu_hours_high"] == round(expected, 1)


def test_longer_expected_replies_need_windows(capsys, tmp_path):
    # up to 3,026 completion tokens every shard fits the 4,100 GB at once (with 4 parts being packed
    # and the state files): one engine start, one extraction pass, the states kept for every epoch;
    # from 3,027 windows, 99 shards and then 1, once per epoch
    for completion, starts in ((3026, 1), (3027, 20)):
        args = [str(KIMI), "--results", str(tmp_path), "--completion-tokens", str(completion)]
        assert cost.main(args) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["engine_starts"] == starts and out["plan"]["one_pass"] == (starts == 1)
        assert out["engine_starts_bound"] == 30  # the bound is the config's, whatever the assumption
    assert out["plan"]["window_shards"] == 99 and out["tokens"] == 10 * 20000 * 3539


def test_a_learning_curve_under_the_cap_extracts_nothing_more_but_its_state_files_count(tmp_path):
    # the Kimi example with two curve points: 3 drafts train on the main draft's states, 2 state files
    # each of 16.9 GB (the bound without the weights), so 4 more files (68 GB) than the 4,100 GB one
    # pass held at the expected length: 2 windows an epoch (20 starts) unless the cap grows by them
    curve = _settings(KIMI, validate={"learning_curve": [0.25, 0.5]})
    out = cost.estimate(curve, 7168, results=tmp_path)
    plan = out["plan"]
    assert plan["drafts_trained"] == 3 and plan["learning_curve_points"] == 2
    assert out["learning_curve_state_bytes"] == 4 * parse_time_state_bytes(curve, 7168) == 67_739_191_552
    assert out["engine_starts"] == 20 and plan["extraction_jobs"] == 1000  # the main draft's alone
    # every draft's windows: the main draft in 20, each point only in those holding its shards
    assert 20 + 2 * 10 <= plan["training_jobs"] <= 3 * 20
    cap = 4100 + out["learning_curve_state_bytes"] / 10**9
    grown = _settings(KIMI, validate={"learning_curve": [0.25, 0.5]}, hidden_states={"max_disk_gb": cap})
    again = cost.estimate(grown, 7168, results=tmp_path)
    assert again["engine_starts"] == 1 and again["plan"]["training_jobs"] == 3  # one pass: 3 runs
    uncapped = cost.estimate(_settings(KIMI, validate={"learning_curve": [0.5]},
                                       hidden_states={"max_disk_gb": None}), 7168)  # fmt: skip
    assert uncapped["plan"]["drafts_trained"] == 2 and uncapped["learning_curve_state_bytes"] == 0
    assert uncapped["engine_starts"] == 1


def test_the_slurm_profile_plans_the_same_engine_starts(capsys, tmp_path):
    # issue 37: the engine is a job grouped with its extraction jobs on the cluster too (one submission
    # per scope), not a private engine per extraction job (1,000 starts before)
    slurm = str(REPO / "profiles" / "slurm")
    assert cost.main([str(KIMI), "--profile", slurm, "--results", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["executor"] == "slurm" and out["engine_starts"] == 1 and out["engine_starts_bound"] == 30
    assert cost.main([str(KIMI), "--results", str(tmp_path)]) == 0
    local = json.loads(capsys.readouterr().out)
    assert local["executor"] == "local" and local["allocations_now"] is None and local["allocations"] is None


def test_the_plan_now_is_the_dag_s_and_the_profile_s_allocations_are_printed(capsys, tmp_path):
    # no trace checked: the DAG holds the bound's 30 engine jobs (10 epochs x windows of 34, 34, 32
    # shards); once checked at the expected length, one engine job over the 100 shards
    slurm = str(REPO / "profiles" / "slurm")
    assert cost.main([str(KIMI), "--profile", slurm, "--results", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine_starts_now"] == 30 and out["plan_now_source"] == "config"
    assert out["plan_now"] == out["plan_bound"]
    now = out["allocations_now"]
    assert now["gpus_as"] == "gpus" and now["allocations"] == 30
    # each scope's group: the engine's 1,000,000 MiB, 4 packing clients' 2,213 MiB and 512 MiB per
    # client; 64 + 4 CPUs; (600 s + shards x 200 x 10,240 tokens / 10,000 tokens/s) x 1.5
    assert [(a["allocations"], a["shards"], a["sbatch"]) for a in now["per_allocation"]] == [
        (20, 34, "-p gpu -t 190 --mem 1026260 --nodes=1 --cpus-per-task=68 --gpus=8"),
        (10, 32, "-p gpu -t 179 --mem 1025236 --nodes=1 --cpus-per-task=68 --gpus=8"),
    ]
    assert now["gpu_hours_reserved"] == round(8 * (20 * 190 + 10 * 179) / 60, 1) == 745.3
    after = out["allocations"]  # completions of 3,000 tokens: one pass, 100 clients in one group
    assert after["per_allocation"] == [
        {
            "sbatch": "-p gpu -t 191 --mem 1060052 --nodes=1 --cpus-per-task=68 --gpus=8",
            "allocations": 1,
            "shards": 100,
            "gpus": 8,
            "time_limit_min": 191,
            "planned_h": 2.12,
        }
    ]
    # a failed client's group again: one engine start and its missing shards (the rest kept), not
    # the 100 shards' 70.24 M tokens again
    assert out["retry"] == {
        "retries": 1,
        "scope_shards": 100,
        "engine_start_gpu_hours": round(8 * 600 / 3600, 2),
        "kept_gpu_hours": round(8 * (600 + 200 * 3512 / 10000) / 3600, 2),
        "whole_scope_gpu_hours": round(8 * (600 + 100 * 200 * 3512 / 10000) / 3600, 2),
    }


def test_a_gres_site_gets_the_same_allocation_as_gres(tmp_path):
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    profile["default-resources"]["gpus_as"] = "gres"
    for resources in profile["set-resources"].values():
        if "gpu" in resources:
            resources["gres"] = f"gpu:{resources.pop('gpu')}"
    out = cost.estimate(_settings(KIMI), 7168, results=tmp_path, profile=profile)
    first = out["allocations_now"]["per_allocation"][0]
    assert first["sbatch"] == "-p gpu -t 190 --mem 1026260 --nodes=1 --cpus-per-task=68 --gres=gpu:8"
    assert first["gpus"] == 8 and out["allocations_now"]["gpus_as"] == "gres"


def _checked_traces(results: Path, shards: int, tokens: int) -> None:
    """support.traces.checked_traces: `tokens` tokens a shard at Kimi-K2.5's 57,353 B a token."""
    made = {"hidden_size": 7168, "dtype": "bfloat16", "max_seq_len": 10240, "overlong": "truncate"}
    checked_traces(results, shards, {"tokens": tokens, "total_bytes": tokens * 57353, **made})


def test_once_the_traces_are_checked_the_plan_is_theirs(capsys, tmp_path):
    # replies of 2,800 tokens on average: 200 x 3,312 tokens a shard, every shard fits at once
    _checked_traces(tmp_path / "kimi-k2.5", 100, 200 * 3312)
    assert cost.main([str(KIMI), "--results", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan_source"] == "traces" and "100 of 100 shards" in out["plan_basis"]
    assert out["engine_starts"] == 1 and out["extraction_passes"] == 1 and out["tokens"] == 100 * 200 * 3312
    assert out["engine_starts_bound"] == 30
    _checked_traces(tmp_path / "kimi-k2.5", 100, 200 * 6000)  # longer replies: windows again
    assert cost.main([str(KIMI), "--results", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan_source"] == "traces" and out["extraction_passes"] == 10
    # (4,066 GB - 4 parts of 1.88 GB) / 68.82 GB a shard: windows of 58
    assert out["engine_starts"] == 10 * 2 and out["plan"]["window_shards"] == 58
    assert out["engine_starts_now"] == 20 and out["plan_now_source"] == "traces"  # the DAG's now


def test_while_some_traces_are_checked_the_dag_plans_the_rest_at_the_bound(capsys, tmp_path):
    # 40 shards checked at 2,800-token replies: the DAG now plans the other 60 at their bound (windows);
    # once they are checked too, at the expected length, every shard fits at once
    _checked_traces(tmp_path / "kimi-k2.5", 40, 200 * 3312)
    assert cost.main([str(KIMI), "--results", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan_now_source"] == "traces and config" and out["engine_starts_now"] == 10 * 3
    assert (
        out["plan_source"] == "traces and expected" and "the rest at the expected length" in out["plan_basis"]
    )
    assert out["engine_starts"] == 1 and out["tokens"] == 40 * 200 * 3312 + 60 * 200 * 3512


def test_uncapped_one_engine_serves_the_run_and_one_the_baseline():
    settings = _settings(KIMI, hidden_states={"max_disk_gb": None}, validate={"baseline": True})
    out = cost.estimate(settings, 7168)
    assert out["engine_starts"] == 2 and out["extraction_passes"] == 1  # the baseline's after the main's
    assert out["engine_starts_bound"] == 2 and out["plan"]["one_pass"]
    no_baseline = _settings(KIMI, hidden_states={"max_disk_gb": None}, validate={"baseline": False})
    assert cost.estimate(no_baseline, 7168)["engine_starts"] == 1
    assert out["plan"]["extraction_jobs"] == 200  # 100 shards + the baseline's 100


def test_the_transformers_backend_loads_the_target_once_per_job():
    settings = _settings(KIMI, hidden_states={"backend": "transformers"})
    out = cost.estimate(settings, 7168)
    assert out["engine_starts"] == 100 and out["engine_starts_bound"] == 1000  # one pass; 10 at the bound


def test_assumptions_are_stated_and_overridable(capsys):
    cost.main([str(KIMI), "--tokens-per-s-fast", "40000", "--start-s-fast", "60"])
    out = json.loads(capsys.readouterr().out)
    assert out["assumptions"]["tokens_per_s_fast"] == 40000 and out["assumptions"]["start_s_fast"] == 60
