"""The vllm backend's pipeline side, without an engine: engine settings from the snapshot and the config,
the interpreter, the worker's environment, and the final norm rebuilt from the checkpoint."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eagle3_pipeline.hidden_states import final_norm, vllm_backend
from eagle3_pipeline.hidden_states.vllm_backend import VllmBackendError
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.settings import VllmEngineSettings

SNAPSHOT = {
    "tensor_parallel_size": 8,
    "max_model_len": 262144,
    "trust_remote_code": True,
    "args": {"--dtype": "bfloat16", "--quantization": "compressed-tensors", "--enforce-eager": True},
    "env": {"VLLM_ATTENTION_BACKEND": "FLASHMLA", "VLLM_API_KEY": "<redacted>", "OTHER": "x"},
    "python": sys.executable,
}


def test_engine_settings_come_from_the_snapshot():
    engine = vllm_backend.engine_settings(VllmEngineSettings(), ServerSnapshot.from_json(SNAPSHOT), 10240)
    assert engine["tensor_parallel_size"] == 8 and engine["dtype"] == "bfloat16"
    assert engine["quantization"] == "compressed-tensors" and engine["trust_remote_code"] is True
    assert engine["enforce_eager"] is True and engine["gpus"] == 8
    # the unit's 262k context is not inherited: extraction needs max_seq_len + 1, and a step sized to it
    assert engine["max_model_len"] == 10241 and engine["max_num_batched_tokens"] == 10241
    assert engine["sources"]["max_model_len"] == "default" and engine["cuda_graphs"] is False


def test_config_overrides_the_snapshot_and_null_keeps_it():
    options = VllmEngineSettings(
        tensor_parallel_size=4, dtype="float16", max_model_len=20000, enforce_eager=False
    )
    engine = vllm_backend.engine_settings(options, ServerSnapshot.from_json(SNAPSHOT), 10240)
    assert (engine["tensor_parallel_size"], engine["dtype"], engine["max_model_len"]) == (4, "float16", 20000)
    assert engine["enforce_eager"] is False and engine["sources"]["enforce_eager"] == "config"
    assert engine["quantization"] == "compressed-tensors" and engine["sources"]["quantization"] == "snapshot"


def test_without_a_snapshot_vllm_defaults_apply():
    engine = vllm_backend.engine_settings(VllmEngineSettings(), None, 2048)
    assert (
        engine["tensor_parallel_size"] == 1 and engine["dtype"] == "auto" and engine["quantization"] is None
    )
    assert engine["max_model_len"] == 2049 and engine["trust_remote_code"] is False


def test_max_model_len_holds_the_longest_sequence_plus_one_token():
    demo = {"max_model_len": 2048, "args": {}}
    engine = vllm_backend.engine_settings(VllmEngineSettings(), ServerSnapshot.from_json(demo), 2048)
    assert engine["max_model_len"] == 2049 and engine["sources"]["max_model_len"] == "default"
    with pytest.raises(VllmBackendError, match=r"hidden_states\.vllm\.max_model_len 2048.*>= 2049"):
        vllm_backend.engine_settings(
            VllmEngineSettings(max_model_len=2048), ServerSnapshot.from_json(demo), 2048
        )


def test_interpreter_is_the_config_key_else_the_snapshot_else_an_error_naming_the_key(tmp_path):
    no_vllm = sys.executable  # the pipeline's env has no vLLM
    with pytest.raises(VllmBackendError, match=r"hidden_states\.vllm\.python.*has no vLLM"):
        vllm_backend.resolve_python(VllmEngineSettings(python=no_vllm), None)
    with pytest.raises(VllmBackendError, match=r"server\.json.*hidden_states\.vllm\.python"):
        vllm_backend.resolve_python(
            VllmEngineSettings(), ServerSnapshot.from_json({"python": str(tmp_path / "elsewhere" / "python")})
        )
    with pytest.raises(VllmBackendError, match=r"set hidden_states\.vllm\.python.*backend: transformers"):
        vllm_backend.resolve_python(VllmEngineSettings(), ServerSnapshot.from_json({"args": {}}))
    vllm_python = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    if vllm_python.exists():
        assert vllm_backend.resolve_python(
            VllmEngineSettings(), ServerSnapshot.from_json({"python": str(vllm_python)})
        ) == str(vllm_python)


def test_worker_env_has_the_units_vllm_variables_our_package_and_no_launcher_ranks(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    folder = vllm_backend.package_path(tmp_path)
    env = vllm_backend.worker_env(folder, ServerSnapshot.from_json(SNAPSHOT))
    assert env["VLLM_ATTENTION_BACKEND"] == "FLASHMLA" and "OTHER" not in env and "RANK" not in env
    assert "VLLM_API_KEY" not in env and "MASTER_PORT" not in env and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["PYTHONPATH"] == str(folder) and (folder / "eagle3_pipeline" / "hidden_states").is_dir()
    # a unit (the demo's) or a shell that runs vLLM's engine in-process: the worker's runs in its own
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    in_process = {**SNAPSHOT, "env": {**SNAPSHOT["env"], "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}
    assert (
        vllm_backend.worker_env(folder, ServerSnapshot.from_json(in_process))[
            "VLLM_ENABLE_V1_MULTIPROCESSING"
        ]
        == "1"
    )


def _checkpoint(folder: Path, keys: dict[str, torch.Tensor], config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.clone() for k, v in keys.items()}, str(folder / "model.safetensors"))
    return folder


def test_final_norm_is_found_beside_the_last_layer_not_in_an_extra_head(tmp_path):
    w = torch.ones(4)
    keys = {
        "language_model.model.layers.0.input_layernorm.weight": w,
        "language_model.model.layers.1.post_attention_layernorm.weight": w,
        "language_model.model.layers.2.shared_head.norm.weight": w,  # DeepSeek's MTP layer
        "language_model.model.norm.weight": w,
        "vision_tower.encoder.norm.weight": w,
    }
    config = {"model_type": "kimi_k25", "text_config": {"num_hidden_layers": 2, "rms_norm_eps": 1e-5}}
    norm = final_norm.find_final_norm(_checkpoint(tmp_path / "kimi", keys, config))
    assert norm.key == "language_model.model.norm.weight" and norm.eps == 1e-5


@pytest.mark.parametrize(
    ("keys", "config", "match"),
    [
        ({"model.layers.0.x.weight": torch.ones(1)}, {}, "expected one final norm"),
        (
            {
                "model.layers.0.x.weight": torch.ones(1),
                "model.norm.weight": torch.ones(1),
                "model.norm.bias": torch.ones(1),
            },
            {},
            "bias",
        ),  # fmt: skip
        ({"model.norm.weight": torch.ones(1)}, {"model_type": "gemma2"}, "not plain RMSNorm"),
        ({"model.norm.weight": torch.ones(1)}, {"rms_norm_eps": None}, "rms_norm_eps"),
    ],
)
def test_a_norm_we_cannot_rebuild_names_the_transformers_backend(tmp_path, keys, config, match):
    full = {"model_type": "llama", "num_hidden_layers": 1, "rms_norm_eps": 1e-6, **config}
    with pytest.raises(final_norm.FinalNormError, match=rf"{match}.*hidden_states\.backend: transformers"):
        final_norm.find_final_norm(_checkpoint(tmp_path / "t", keys, {k: v for k, v in full.items() if v}))


def test_rms_norm_is_transformers_llama_rmsnorm_bit_for_bit():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    reference = LlamaRMSNorm(64, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        reference.weight.copy_(torch.randn(64))
    states = (torch.randn(5, 64) * 30).to(torch.bfloat16)
    got = final_norm.rms_norm(states, reference.weight.detach().float(), 1e-6)
    assert torch.equal(got, reference(states))


def test_the_tiny_targets_final_norm_turns_the_last_layer_output_into_last_hidden_state(hs_target):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hs_target), dtype=torch.bfloat16).eval()
    norm = final_norm.find_final_norm(hs_target)
    ids = torch.arange(3, 40)[None]
    with torch.inference_mode():
        out = model.model(input_ids=ids, output_hidden_states=True)
    # hidden_states[-1] is already normed in transformers: the pre-norm one is the last layer's output
    pre = {}
    handle = model.model.layers[-1].register_forward_hook(
        lambda m, a, o: pre.update(x=o[0] if isinstance(o, tuple) else o)
    )
    with torch.inference_mode():
        model.model(input_ids=ids)
    handle.remove()
    got = final_norm.rms_norm(pre["x"][0], final_norm.load_weight(norm), norm.eps)
    assert torch.equal(got, out.last_hidden_state[0])
