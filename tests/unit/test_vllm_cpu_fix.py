"""src/eagle3_pipeline/vllm_cpu_fix.py without vLLM: the finder, what interpreter start costs, the
kernel asked for its fault, and the replacement kernel's values. The finder runs in a bare interpreter
(`-S`, site-packages added only after the start-up is measured) that loads the module by its path as
the .pth in .venv-vllm does, with a stand-in `vllm.utils.cpu_triton_utils` on its path: the faulty
kernel as 0.32.0 and 0.33.0 ship it (the C++ op, here its Python equivalent, writes into an int64 copy
of `output`), or one that writes its output. The real one: tests/integration/test_vllm_cpu_fix_installed.py.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagle3_pipeline import vllm_cpu_fix

MODULE = Path(vllm_cpu_fix.__file__)
# the stand-ins below take the place of this vLLM module (vllm_compat.py checks it where it exists)
VLLM_NAMES = (
    ("module", "vllm.utils.cpu_triton_utils", {"below": "0.34"}),
    ("name", "vllm.utils.cpu_triton_utils", "_expand_kernel_impl", {"below": "0.34"}),
)

# the .pth's loading, then what a vLLM process does: import the module cpu.py registers kernels from,
# and call the kernel as the sampler does (a float32 temperature per request)
SCRIPT = r"""
import sys
p = sys.argv[1]
m = type(sys)('eagle3_vllm_cpu_fix'); m.__file__ = p; sys.modules[m.__name__] = m
with open(p) as f: exec(compile(f.read(), p, 'exec'), m.__dict__)
finder = m.install()
heavy = ("importlib.metadata", "importlib.util", "logging", "torch", "vllm")
at_start = [k for k in heavy if k in sys.modules]
sys.path.extend(sys.argv[2:])  # torch, for the kernel's call
import logging
logging.basicConfig(level=logging.DEBUG, format="%(name)s %(message)s")
import vllm.utils.cpu_triton_utils as cpu_tl
import json, torch
output = torch.zeros(6)
cpu_tl._expand_kernel_impl(output, torch.tensor([0.6, 0.9]), torch.tensor([3, 6], dtype=torch.int32), 0, 0)
chosen = getattr(cpu_tl._expand_kernel_impl, "eagle3_chosen", [cpu_tl._expand_kernel_impl])
print(json.dumps({
    "installed": finder is not None,
    "at_start": at_start,
    "used": chosen[0].__name__,
    "output": [round(v, 4) for v in output.tolist()],
    "finder_left": any(getattr(f, "eagle3_vllm_cpu_fix", False) for f in sys.meta_path),
}))
"""

# the stand-ins: 0.32.0's kernel (its C++ op's effect: `output` converted to a new int64 tensor, which
# is written and dropped), and one that writes its output as the Triton kernel does
KERNELS = {
    "faulty": (
        "import torch\n"
        "def _ensure_int64(t):\n    return t if t.dtype == torch.int64 else t.to(torch.int64)\n"
        "def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to,"
        " MAX_NUM_TOKENS=None):\n"
        "    out = _ensure_int64(output)\n    out.fill_(1)\n"
    ),
    "correct": (
        "import torch\n"
        "def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to,"
        " MAX_NUM_TOKENS=None):\n"
        "    counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1))\n"
        "    output.copy_(torch.repeat_interleave(input_val, counts))\n"
    ),
}


def _run(tmp_path: Path, kernel: str, env: dict[str, str] | None = None):
    package = tmp_path / "vllm" / "utils"
    package.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "cpu_triton_utils.py").write_text(KERNELS[kernel])
    run = subprocess.run(
        [sys.executable, "-S", "-c", SCRIPT, str(MODULE), *site.getsitepackages()],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # '' on sys.path: the stand-ins
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env or {})},
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout), run.stderr


@pytest.mark.parametrize(("kernel", "replaced"), [("faulty", True), ("correct", False)])
def test_the_kernel_is_replaced_only_when_it_leaves_a_float_output_unwritten(tmp_path, kernel, replaced):
    result, log = _run(tmp_path, kernel)
    # start-up: a finder on sys.meta_path, nothing imported (it waits for vLLM's module)
    assert result["installed"] is True
    assert result["at_start"] == []
    assert result["used"] == ("expand_kernel_impl_fixed" if replaced else "_expand_kernel_impl")
    assert result["output"] == [0.6, 0.6, 0.6, 0.9, 0.9, 0.9]  # the sampler's temperatures, either way
    assert result["finder_left"] is False  # gone after the one import it watches
    lines = [line for line in log.splitlines() if "eagle3_pipeline_cpu_fix" in line]
    assert len(lines) == (1 if replaced else 0), log
    if replaced:
        assert "(probed)" in lines[0] and "EAGLE3_VLLM_CPU_FIX=0" in lines[0]


@pytest.mark.parametrize("value", ["0", "false", "off"])
def test_eagle3_vllm_cpu_fix_0_turns_it_off(tmp_path, value):
    result, log = _run(tmp_path, "faulty", {"EAGLE3_VLLM_CPU_FIX": value})
    assert result["installed"] is False and result["used"] == "_expand_kernel_impl"
    assert result["output"] == [0.0] * 6  # the fault, left as vLLM ships it
    assert "eagle3_pipeline_cpu_fix" not in log


def _reference(output, x, cu, replace_from, replace_to, max_num_tokens):
    """The Triton expand_kernel, one request (program) at a time."""
    out = output.clone()
    start = 0
    for i in range(x.shape[0]):
        end = int(cu[i])
        value = replace_to if x[i].item() == replace_from else x[i].item()
        for j in range(min(end - start, max_num_tokens)):
            out[start + j] = value
        start = end
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64], ids=str)
def test_the_replacement_writes_the_kernels_values(dtype):
    calls = []

    def original(output, *args):
        calls.append(args)
        output.copy_(_reference(output, *args))  # vLLM's C++ op, correct for an int64 output

    fixed = vllm_cpu_fix.fixed_expand(original)
    x = (
        torch.tensor([0.6, 0.0, 0.9, 0.3]).to(dtype)
        if dtype.is_floating_point
        else torch.tensor([5, 0, 7, 3], dtype=dtype)
    )
    cu = torch.tensor([3, 3, 6, 11], dtype=torch.int32)  # an empty request; the last longer than MAX
    for replace_from, replace_to, max_num_tokens in [(0, 0, 128), (0, 1, 128), (0, 9, 4)]:
        output = torch.full((12,), -5, dtype=dtype)
        expected = _reference(output, x, cu, replace_from, replace_to, max_num_tokens)
        fixed(output, x, cu, replace_from, replace_to, max_num_tokens)
        assert torch.equal(output, expected), (replace_from, replace_to, max_num_tokens, output, expected)
    assert len(calls) == (3 if dtype == torch.int64 else 0)
    empty = torch.full((2,), -5, dtype=dtype)
    fixed(empty, x[:0], cu[:0], 0, 0, 128)
    assert empty.tolist() == [-5, -5]
