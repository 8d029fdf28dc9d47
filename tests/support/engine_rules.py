"""Which target layers each serving engine feeds a draft checkpoint, by that engine's own rule.

vLLM: its real code, run in .venv-vllm on the checkpoint's config.json as vLLM loads it (the config
parser, then both model runners' readers, then the model default when they find nothing).

SGLang: not installed here, so its rule is encoded, as read in sgl-project/sglang:
  - python/sglang/srt/model_executor/model_runner.py, ModelRunner.__init__ (EAGLE3): the ids are
    draft hf_config.eagle_config["eagle_aux_hidden_state_layer_ids"], None when absent;
  - python/sglang/srt/models/llama.py, LlamaForCausalLM.set_eagle3_layers_to_capture:
    layers_to_capture = [2, N // 2, N - 3] when None, else [id + 1 for id in ids] ("for the ith layer,
    it takes the output of the (i-1)th layer as aux hidden state");
  - LlamaModel.forward appends the residual stream entering layer i when i is in layers_to_capture.
Both return "input of decoder layer i" indices, i.e. the output of 0-indexed layer i - 1.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
# the vLLM names VLLM_RULE imports (vllm_compat.py checks them in each supported release's wheel)
VLLM_NAMES = (
    ("name", "vllm.transformers_utils.config", "get_config"),
    ("name", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", {"below": "0.34"}),
    ("member", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner._get_eagle3_aux_layers_from_config",
     {"below": "0.34"}),
    ("name", "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils", "get_eagle3_aux_layers_from_config"),
    ("name", "vllm.model_executor.models.interfaces", "SupportsEagle3"),
    ("member", "vllm.model_executor.models.interfaces",
     "SupportsEagle3.get_eagle3_default_aux_hidden_state_layers"),
)  # fmt: skip

VLLM_RULE = r"""
import json, sys
from types import SimpleNamespace
from vllm.transformers_utils.config import get_config
try:  # the V1 model runner: 0.34 removed it (Model Runner V2 only)
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
except ImportError:
    GPUModelRunner = None
from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config
from vllm.model_executor.models.interfaces import SupportsEagle3

results = []
for checkpoint, num_layers in json.loads(sys.argv[1]):
    spec = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=get_config(checkpoint, False)))
    target = SimpleNamespace(model=SimpleNamespace(layers=[None] * num_layers))
    default = SupportsEagle3.get_eagle3_default_aux_hidden_state_layers(target)
    v1 = GPUModelRunner and GPUModelRunner._get_eagle3_aux_layers_from_config(
        SimpleNamespace(speculative_config=spec))
    v2 = get_eagle3_aux_layers_from_config(spec)
    results.append({"v1": list(v1 or default) if GPUModelRunner else None, "v2": list(v2 or default)})
print(json.dumps(results))
"""


def vllm_fed_layers(cases: list[tuple[Path, int]]) -> list[dict[str, list[int]]]:
    """For each (checkpoint, N): {"v1": ids, "v2": ids}, the layers vLLM's V1 runner (CPU; None on a
    vLLM without it, 0.34 and later) and Model Runner V2 (GPU) capture for that checkpoint beside an
    N-layer target, in vLLM's numbering (input of layer i). One process for all cases: importing vLLM
    takes seconds."""
    argument = json.dumps([[str(checkpoint), int(n)] for checkpoint, n in cases])
    out = subprocess.run(
        [str(VLLM_PYTHON), "-c", VLLM_RULE, argument],
        capture_output=True,
        text=True,
        timeout=600,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"vLLM's rule failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def sglang_fed_layers(config: dict, num_layers: int) -> list[int]:
    """The layers SGLang captures for a draft config.json beside an N-layer target (module docstring),
    as "input of layer i" indices."""
    try:
        ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    except (KeyError, TypeError):
        ids = None
    if ids is None:
        return [2, num_layers // 2, num_layers - 3]
    return [int(i) + 1 for i in ids]
