"""The extraction engine's settings and version gate, without vLLM: a long-context unit, a DP/EP unit,
the batched-token budget, and a vLLM outside the tested range (issue 22)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3_pipeline.hidden_states import vllm_backend
from eagle3_pipeline.hidden_states.vllm_backend import VllmBackendError
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.settings import VllmEngineSettings

KIMI_UNIT = {
    "tensor_parallel_size": 8,
    "max_model_len": 262144,
    "trust_remote_code": True,
    "args": {"--tensor-parallel-size": 8, "--max-model-len": 262144, "--trust-remote-code": True},
}
DP_EP_UNIT = {  # `vllm serve ... --data-parallel-size 8 --enable-expert-parallel` (no -tp)
    "tensor_parallel_size": 1,
    "max_model_len": 262144,
    "trust_remote_code": True,
    "args": {"--data-parallel-size": 8, "--enable-expert-parallel": True, "--max-model-len": 262144},
}


def test_a_262k_unit_gives_an_engine_sized_for_max_seq_len_not_its_context():
    engine = vllm_backend.engine_settings(
        VllmEngineSettings(), ServerSnapshot.from_json(KIMI_UNIT), 10240, batch_tokens=32768
    )
    assert engine["max_model_len"] == 10241  # never the unit's 262,144
    assert engine["max_num_batched_tokens"] == 32768  # explicit: max(max_model_len, batch_tokens)
    assert engine["tensor_parallel_size"] == 8 and engine["gpus"] == 8
    assert engine["enable_expert_parallel"] is False and engine["cuda_graphs"] is False


def test_a_data_parallel_unit_without_tp_is_refused_naming_the_key_and_the_gpu_count():
    with pytest.raises(VllmBackendError) as err:
        vllm_backend.engine_settings(VllmEngineSettings(), ServerSnapshot.from_json(DP_EP_UNIT), 10240)
    message = str(err.value)
    assert "--data-parallel-size 8 --enable-expert-parallel and no --tensor-parallel-size" in message
    assert "hidden_states.vllm.tensor_parallel_size" in message and "TP x DP = 8" in message


def test_a_data_parallel_unit_with_tp_set_here_keeps_expert_parallelism():
    engine = vllm_backend.engine_settings(
        VllmEngineSettings(tensor_parallel_size=8), ServerSnapshot.from_json(DP_EP_UNIT), 10240
    )
    assert engine["tensor_parallel_size"] == 8 and engine["gpus"] == 8
    assert (
        engine["enable_expert_parallel"] is True and engine["sources"]["enable_expert_parallel"] == "snapshot"
    )
    assert engine["max_model_len"] == 10241


def test_a_step_smaller_than_one_sequence_is_refused():
    with pytest.raises(VllmBackendError, match=r"max_num_batched_tokens 4096 is below max_model_len 10241"):
        vllm_backend.engine_settings(
            VllmEngineSettings(max_num_batched_tokens=4096), ServerSnapshot.from_json(KIMI_UNIT), 10240
        )


@pytest.mark.parametrize("version", ["0.32.0", "0.32.3", "0.32.1rc1", "0.32.0+cpu", "0.33.0", "0.34.0"])
def test_the_supported_vllm_range_passes(version):
    vllm_backend.check_vllm_version(version, allow_untested=False)


@pytest.mark.parametrize("version", ["0.31.2", "0.35.0", "1.0.0", "not-a-version"])
def test_a_vllm_outside_the_supported_range_is_refused_naming_the_range_and_the_override(version):
    with pytest.raises(VllmBackendError) as err:
        vllm_backend.check_vllm_version(version, allow_untested=False)
    assert f"vLLM {version} " in str(err.value) and ">=0.32,<0.35" in str(err.value)
    assert "hidden_states.vllm.allow_untested_version: true" in str(err.value)
    vllm_backend.check_vllm_version(version, allow_untested=True)  # the override lets it run


def test_staging_goes_to_the_configured_folder_else_shm_when_it_fits_else_work(tmp_path):
    assert vllm_backend.staging_dir(VllmEngineSettings(staging_dir="/fast"), tmp_path, 10, 128) == Path(
        "/fast"
    )
    small = vllm_backend.staging_dir(VllmEngineSettings(), tmp_path, 1000, 128)
    assert str(small).startswith("/dev/shm/eagle3-") or small == tmp_path / "staging"
    huge = vllm_backend.staging_dir(VllmEngineSettings(), tmp_path, 10**12, 7168)  # no /dev/shm holds this
    assert huge == tmp_path / "staging"
