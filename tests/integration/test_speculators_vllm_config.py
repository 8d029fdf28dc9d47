"""vLLM's own readers (.venv-vllm) make of the speculators folder the draft they make of the EAGLE one:
every config field its Eagle3 Llama model reads, the layers both model runners feed it, and the
speculative config `vllm serve FOLDER` takes from the folder. No server: tests/integration/
test_speculators_serve.py serves both folders."""

from __future__ import annotations

import json
import subprocess

import pytest
from support.requirements import VLLM_PYTHON
from support.speculators_export import CASES, export_both

pytestmark = pytest.mark.vllm

# the vLLM names READ imports (vllm_compat.py checks them in each supported release's wheel); without
# the V1 runner (0.34) its layers are V2's
VLLM_NAMES = (
    ("name", "vllm.transformers_utils.config", "get_config"),
    ("name", "vllm.transformers_utils.configs.speculators.base", "SpeculatorsConfig"),
    ("member", "vllm.transformers_utils.configs.speculators.base",
     "SpeculatorsConfig.extract_vllm_speculative_config"),
    ("name", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", {"below": "0.34"}),
    ("name", "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils", "get_eagle3_aux_layers_from_config"),
)  # fmt: skip

# get_config parses either folder as vLLM loads a draft (the speculators one through
# transformers_utils/configs/speculators/); the fields are those llama_eagle3.py and LlamaAttention read
READ = r"""
import json, sys
from types import SimpleNamespace
from vllm.transformers_utils.config import get_config
from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig
try:  # the V1 model runner: 0.34 removed it (Model Runner V2 only)
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
except ImportError:
    GPUModelRunner = None
from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config

FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "rms_norm_eps", "vocab_size", "draft_vocab_size",
          "target_hidden_size", "max_position_embeddings", "attention_bias", "hidden_act",
          "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
out = {}
for name, folder in json.loads(sys.argv[1]).items():
    config = get_config(folder, False)
    spec = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=config))
    fields = {f: getattr(config, f, None) for f in FIELDS}
    fields["rope_theta"] = (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
    fields["v2_layers"] = list(get_eagle3_aux_layers_from_config(spec) or [])
    fields["v1_layers"] = list(GPUModelRunner._get_eagle3_aux_layers_from_config(
        SimpleNamespace(speculative_config=spec)) or []) if GPUModelRunner else fields["v2_layers"]
    raw = json.load(open(f"{folder}/config.json"))
    if "speculators_config" in raw:
        fields["speculative"] = SpeculatorsConfig.extract_vllm_speculative_config(raw)
    out[name] = {"architectures": config.architectures, "fields": fields}
print(json.dumps(out))
"""


def test_vllm_reads_the_speculators_folder_as_the_eagle_one(random_target, tmp_path):
    folders = {}
    for case, options in CASES.items():
        export_both(random_target, tmp_path / case, options)
        folders |= {f"{case}/{name}": str(tmp_path / case / name) for name in ("checkpoint", "speculators")}
    run = subprocess.run(  # one process: importing vLLM takes seconds
        [str(VLLM_PYTHON), "-c", READ, json.dumps(folders)],
        capture_output=True,
        text=True,
        timeout=600,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    read = json.loads(run.stdout.strip().splitlines()[-1])
    for case, options in CASES.items():
        eagle, speculators = read[f"{case}/checkpoint"], read[f"{case}/speculators"]
        # both name the model class vLLM builds: Eagle3LlamaForCausalLM (the EAGLE name is its alias)
        assert eagle["architectures"] == ["LlamaForCausalLMEagle3"], case
        assert speculators["architectures"] == ["Eagle3LlamaForCausalLM"], case
        speculative = speculators["fields"].pop("speculative")
        assert speculative == {"method": "eagle3", "num_speculative_tokens": 3}, case
        assert speculators["fields"] == eagle["fields"], case
        flags = dict.fromkeys(("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"), False)
        assert {k: eagle["fields"][k] for k in flags} == flags | options, case
        assert eagle["fields"]["v1_layers"] == eagle["fields"]["v2_layers"] == [1, 2, 3], case
