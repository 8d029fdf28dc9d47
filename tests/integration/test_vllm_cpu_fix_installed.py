"""vLLM 0.32's CPU `_expand_kernel_impl` writes nothing into a float or int32 output; the .pth that
envs/install.sh puts into .venv-vllm (src/eagle3_pipeline/vllm_cpu_fix.py) wraps it before the CPU
platform registers it (vllm/platforms/cpu.py reads the module attribute when the worker starts), and
the wrapper's first call finds the fault in the installed kernel itself and replaces it. A vLLM
without the module (0.34 removed it) is skipped with that reason.
Both on the installed vLLM, each in its own interpreter: without the fix (EAGLE3_VLLM_CPU_FIX=0) the
bug, with it the Triton kernel's values for every dtype the sampler expands. Not through
`expand_batch_to_tokens` behind the registered override: importing the rejection sampler alone costs
half a minute here (checked by hand once, docs/validation.md)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from support.requirements import VLLM_PYTHON

pytestmark = pytest.mark.vllm

# the vLLM names SCRIPT uses (vllm_compat.py checks them in each supported release's wheel)
VLLM_NAMES = (
    ("module", "vllm.utils.cpu_triton_utils", {"below": "0.34"}),
    ("name", "vllm.utils.cpu_triton_utils", "_expand_kernel_impl", {"below": "0.34"}),
    ("name", "vllm.platforms", "current_platform"),
    ("member", "vllm.platforms.interface", "Platform.import_kernels"),
)

# out[cu[i-1]:cu[i]] = replace_to if x[i] == replace_from else x[i]; cu as the sampler's (int32)
CASES = {
    # name: (dtype, x, replace_from, replace_to, expected)
    "float32": ("float32", [0.6, 0.9], 0, 0, [0.6, 0.6, 0.6, 0.9, 0.9, 0.9]),
    # the temperature: GREEDY_TEMPERATURE (0) of a greedy request in a sampled batch becomes 1
    "float32_replaced": ("float32", [0.0, 0.6], 0, 1, [1.0, 1.0, 1.0, 0.6, 0.6, 0.6]),
    "int32": ("int32", [5, 7], 0, 0, [5, 5, 5, 7, 7, 7]),  # top_k
    "int32_replaced": ("int32", [5, 0], 0, 9, [5, 5, 5, 9, 9, 9]),
    "int64": ("int64", [5, 7], 0, 0, [5, 5, 5, 7, 7, 7]),
    "int64_replaced": ("int64", [5, 0], 0, 9, [5, 5, 5, 9, 9, 9]),
}

SCRIPT = r"""
import importlib.util, json, sys
if importlib.util.find_spec("vllm.utils.cpu_triton_utils") is None:
    print(json.dumps({"absent": True}))
    sys.exit(0)
import torch
import vllm.utils.cpu_triton_utils as cpu_tl
from vllm.platforms import current_platform

current_platform.import_kernels()  # torch.ops._C on this CPU (AVX2/AVX512 build), as the engine does
cases = json.loads(sys.argv[1])
cu = torch.tensor([3, 6], dtype=torch.int32)
out = {"impl": repr(cpu_tl._expand_kernel_impl), "direct": {}}
for name, (dtype, x, replace_from, replace_to, _) in cases.items():
    dtype = getattr(torch, dtype)
    output = torch.zeros(6, dtype=dtype)
    cpu_tl._expand_kernel_impl(output, torch.tensor(x, dtype=dtype), cu, replace_from, replace_to, 128)
    out["direct"][name] = output.tolist()
out["chosen"] = [f.__name__ for f in getattr(cpu_tl._expand_kernel_impl, "eagle3_chosen", [])]
print(json.dumps(out))
"""


def _start(fix: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "EAGLE3_"))}
    env |= {"EAGLE3_VLLM_CPU_FIX": fix, "VLLM_TARGET_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [str(VLLM_PYTHON), "-c", SCRIPT, json.dumps(CASES)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    """Both interpreters at once (importing vLLM takes nearly all the time): off and on."""
    started = {"off": _start("0"), "on": _start("1")}
    results = {}
    for name, process in started.items():
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-3000:]
        results[name] = json.loads(stdout.strip().splitlines()[-1])
        if results[name].get("absent"):
            pytest.skip("this vLLM has no vllm/utils/cpu_triton_utils.py (0.34 removed it): nothing to fix")
    return results


def _close(got: list, expected: list) -> bool:
    return len(got) == len(expected) and all(abs(a - b) < 1e-6 for a, b in zip(got, expected, strict=True))


def test_without_the_fix_a_float_or_int32_output_is_never_written(runs):
    off = runs["off"]
    assert "expand_kernel_impl_checked" not in off["impl"], off["impl"]
    # the bug: the C++ op writes an int64 copy of `output`, which is dropped
    assert off["direct"]["float32"] == [0.0] * 6
    assert off["direct"]["float32_replaced"] == [0.0] * 6
    assert off["direct"]["int32"] == [0] * 6
    assert off["direct"]["int32_replaced"] == [0] * 6
    # an int64 output is written in place: correct without the fix
    assert off["direct"]["int64"] == [5, 5, 5, 7, 7, 7]
    assert off["direct"]["int64_replaced"] == [5, 5, 5, 9, 9, 9]


def test_with_the_fix_every_dtype_gets_the_kernels_values(runs):
    on = runs["on"]
    assert "expand_kernel_impl_checked" in on["impl"], (
        f"{on['impl']}: the fix is not installed in .venv-vllm (run envs/install.sh vllm)"
    )
    assert on["chosen"] == ["expand_kernel_impl_fixed"]  # the probe found the installed kernel faulty
    for name, (*_, expected) in CASES.items():
        assert _close(on["direct"][name], expected), (name, on["direct"][name])
