"""Which vLLM engine settings invalidate saved parts (issue 37, item 4): only those that change the
bytes (dtype, quantization, parallelism, remote code); memory, graphs, connector, the interpreter and
the engine's sizing are run-time settings, so lowering gpu_memory_utilization after an out-of-memory
crash keeps every saved part. The rules' side (no rerun trigger) is in tests/workflow/test_rerun_triggers.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from eagle3_pipeline.hidden_states import parts, vllm_backend
from eagle3_pipeline.hidden_states.job import ShardJob
from eagle3_pipeline.hidden_states.plan import ShardPlan, TargetInfo
from eagle3_pipeline.hidden_states.sequences import SequenceStats, TrainingSequence
from eagle3_pipeline.settings import HiddenStatesSettings, VllmEngineSettings

HS = HiddenStatesSettings(backend="vllm")
ENGINE = vllm_backend.engine_settings(VllmEngineSettings(), None, HS.max_seq_len, HS.batch_tokens)
# a value other than engine_settings' default for every setting the engine dict carries
CHANGED = {
    "python": "/opt/other/bin/python",
    "gpu_memory_utilization": 0.5,
    "max_model_len": 20000,
    "max_num_batched_tokens": 40000,
    "enforce_eager": True,
    "cuda_graphs": True,
    "connector": "sync",
    "staging_dir": "/tmp/elsewhere",
    "max_in_flight_tokens": 7,
    "max_clients": 5,
    "idle_timeout_s": 10.0,
    "allow_untested_version": True,
    "expected_tokens_per_s": 20000.0,
    "expected_start_s": 60.0,
    "dtype": "float16",
    "quantization": "fp8",
    "tensor_parallel_size": 8,
    "enable_expert_parallel": True,
    "trust_remote_code": True,
}


def _plan(tmp_path: Path) -> ShardPlan:
    job = ShardJob(Path("t.parquet"), 0, tmp_path, tmp_path / "o", tmp_path / "m", tmp_path / "w")
    seqs = [TrainingSequence("a", [1, 2, 3], [0, 1, 1])]
    return ShardPlan(job, TargetInfo(8, 128, 1024, "sha"), [1, 3, 4], seqs, SequenceStats(), [[0]])


def test_every_engine_key_is_either_run_time_or_a_bytes_key():
    keys = {f.name for f in dataclasses.fields(VllmEngineSettings)}
    assert set(vllm_backend.RUNTIME_KEYS) | set(vllm_backend.BYTES_KEYS) == keys
    assert not set(vllm_backend.RUNTIME_KEYS) & set(vllm_backend.BYTES_KEYS)
    assert set(CHANGED) == keys


@pytest.mark.parametrize("key", vllm_backend.RUNTIME_KEYS)
def test_a_run_time_engine_setting_keeps_the_saved_parts(tmp_path, key):
    plan = _plan(tmp_path)
    assert parts.fingerprint(HS, plan, {**ENGINE, key: CHANGED[key]}) == parts.fingerprint(HS, plan, ENGINE)


@pytest.mark.parametrize("key", vllm_backend.BYTES_KEYS)
def test_a_setting_that_changes_the_bytes_starts_the_parts_afresh(tmp_path, key):
    plan = _plan(tmp_path)
    assert parts.fingerprint(HS, plan, {**ENGINE, key: CHANGED[key]}) != parts.fingerprint(HS, plan, ENGINE)


def test_the_plans_own_keys_change_the_fingerprint(tmp_path):
    plan = _plan(tmp_path)
    key = parts.fingerprint(HS, plan, ENGINE)
    assert parts.fingerprint(dataclasses.replace(HS, dtype="float16"), plan, ENGINE) != key
    assert parts.fingerprint(HS, dataclasses.replace(plan, layers=[1, 2, 3]), ENGINE) != key
    # max_seq_len reaches the bytes through the sequences it truncates (a shorter sequence: new parts)
    truncated = [dataclasses.replace(plan.seqs[0], input_ids=[1, 2], loss_mask=[0, 1])]
    assert parts.fingerprint(HS, dataclasses.replace(plan, seqs=truncated), ENGINE) != key
