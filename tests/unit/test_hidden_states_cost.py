"""`make cost`: the extraction plan's counts and GPU hours from a config alone (issue 22), no vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from eagle3_pipeline.config import check_config
from eagle3_pipeline.hidden_states import cost
from eagle3_pipeline.settings import Settings, build_settings

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "config" / "schema.yaml"
KIMI = REPO / "config" / "examples" / "kimi-k2.5-8gpu.yaml"


def _settings(path: Path, **changes: dict) -> Settings:
    raw = yaml.safe_load(path.read_text())
    for section, values in changes.items():
        raw[section] = {**raw.get(section, {}), **values}
    return build_settings(check_config(raw, SCHEMA))


def test_the_kimi_example_starts_one_engine_per_epoch_and_window(capsys):
    assert cost.main([str(KIMI)]) == 0
    out = json.loads(capsys.readouterr().out)  # one JSON object
    assert out["engine_starts"] == 30  # 10 epochs x 3 windows of 34 shards (per shard: 1,000)
    assert out["extraction_passes"] == 10 and out["plan"]["extraction_jobs"] == 1000
    assert out["tokens"] == 10 * 20000 * 8704  # every sample at min(512 + 8192, max_seq_len), 10 passes
    assert out["disk_peak_bytes"] <= 4100 * 10**9 + out["staging_bytes"]
    assert 0 < out["gpu_hours_low"] < out["gpu_hours_high"]
    low = out["assumptions"]
    expected = 8 * (30 * low["start_s_fast"] + out["tokens_low"] / low["tokens_per_s_fast"]) / 3600
    assert out["gpu_hours_low"] == round(expected, 1)


def test_the_slurm_profile_plans_the_same_engine_starts(capsys):
    # issue 37: the engine is a job grouped with its extraction jobs on the cluster too (one submission
    # per scope), not a private engine per extraction job (1,000 starts before)
    assert cost.main([str(KIMI), "--profile", str(REPO / "profiles" / "slurm")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["executor"] == "slurm" and out["engine_starts"] == 30
    assert cost.main([str(KIMI)]) == 0
    assert json.loads(capsys.readouterr().out)["executor"] == "local"


def test_uncapped_one_engine_serves_the_run_and_one_the_baseline():
    settings = _settings(KIMI, hidden_states={"max_disk_gb": None}, validate={"baseline": True})
    out = cost.estimate(settings, 7168)
    assert out["engine_starts"] == 2 and out["extraction_passes"] == 1  # the baseline's after the main's
    no_baseline = _settings(KIMI, hidden_states={"max_disk_gb": None}, validate={"baseline": False})
    assert cost.estimate(no_baseline, 7168)["engine_starts"] == 1
    assert out["plan"]["extraction_jobs"] == 200  # 100 shards + the baseline's 100


def test_the_transformers_backend_loads_the_target_once_per_job():
    settings = _settings(KIMI, hidden_states={"backend": "transformers"})
    assert cost.estimate(settings, 7168)["engine_starts"] == 1000


def test_assumptions_are_stated_and_overridable(capsys):
    cost.main([str(KIMI), "--tokens-per-s-fast", "40000", "--start-s-fast", "60"])
    out = json.loads(capsys.readouterr().out)
    assert out["assumptions"]["tokens_per_s_fast"] == 40000 and out["assumptions"]["start_s_fast"] == 60
