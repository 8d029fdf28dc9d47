"""src/eagle3_pipeline/vllm_cpu_fix.py without vLLM: the version gate, what interpreter start costs, and
the replacement kernel's values. The gate runs in a bare interpreter (`-S`) that loads the module by its
path as the .pth in .venv-vllm does, with a stand-in `vllm.utils.cpu_triton_utils` and a stand-in
installed distribution (a .dist-info folder, read by importlib.metadata) on its path."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagle3_pipeline import vllm_cpu_fix

MODULE = Path(vllm_cpu_fix.__file__)

# the .pth's loading, then what a vLLM process does: import the module cpu.py registers kernels from
SCRIPT = r"""
import sys
p = sys.argv[1]
m = type(sys)('eagle3_vllm_cpu_fix'); m.__file__ = p; sys.modules[m.__name__] = m
with open(p) as f: exec(compile(f.read(), p, 'exec'), m.__dict__)
finder = m.install()
heavy = ("importlib.metadata", "importlib.util", "logging", "torch", "vllm")
at_start = [k for k in heavy if k in sys.modules]
import logging
logging.basicConfig(level=logging.DEBUG, format="%(name)s %(message)s")
import vllm.utils.cpu_triton_utils as cpu_tl
import json
print(json.dumps({
    "installed": finder is not None,
    "at_start": at_start,
    "impl": cpu_tl._expand_kernel_impl.__name__,
    "finder_left": any(getattr(f, "eagle3_vllm_cpu_fix", False) for f in sys.meta_path),
}))
"""


def _run(tmp_path: Path, distribution: str | None, version: str, env: dict[str, str] | None = None):
    package = tmp_path / "vllm" / "utils"
    package.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "cpu_triton_utils.py").write_text(
        "def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to,"
        " MAX_NUM_TOKENS=None):\n    pass\n"
    )
    if distribution:
        info = tmp_path / f"{distribution.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    run = subprocess.run(
        [sys.executable, "-S", "-c", SCRIPT, str(MODULE)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # '' on sys.path: the stand-ins
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env or {})},
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout), run.stderr


@pytest.mark.parametrize(
    ("distribution", "version", "patched"),
    [
        ("vllm-cpu", "0.32.0", True),
        ("vllm-cpu", "0.32.3", True),
        ("vllm-cpu", "0.33.0", False),  # another version
        ("vllm-cpu", "0.31.9", False),
        ("vllm", "0.32.0", False),  # the CUDA build's distribution
        (None, "", False),  # no vLLM installed
    ],
)
def test_only_vllm_cpu_0_32_is_patched(tmp_path, distribution, version, patched):
    result, log = _run(tmp_path, distribution, version)
    # start-up: a finder on sys.meta_path, nothing imported (the gate waits for vLLM's module)
    assert result["installed"] is True
    assert result["at_start"] == []
    assert result["impl"] == ("expand_kernel_impl_fixed" if patched else "_expand_kernel_impl")
    assert result["finder_left"] is False  # gone after the one import it watches, patched or not
    lines = [line for line in log.splitlines() if "eagle3_pipeline_cpu_fix" in line]
    assert len(lines) == (1 if patched else 0), log
    if patched:
        assert f"vllm-cpu {version}" in lines[0] and "EAGLE3_VLLM_CPU_FIX=0" in lines[0]


@pytest.mark.parametrize("value", ["0", "false", "off"])
def test_eagle3_vllm_cpu_fix_0_turns_it_off(tmp_path, value):
    result, log = _run(tmp_path, "vllm-cpu", "0.32.0", {"EAGLE3_VLLM_CPU_FIX": value})
    assert result == {"installed": False, "at_start": [], "impl": "_expand_kernel_impl", "finder_left": False}
    assert "eagle3_pipeline_cpu_fix" not in log


def test_the_gate_reads_the_distribution_not_vllm(monkeypatch):
    asked = []

    def version(name):
        asked.append(name)
        if name != "vllm-cpu" or installed is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed

    monkeypatch.setattr(importlib.metadata, "version", version)
    cases = [("0.32.0", "0.32.0"), ("0.32.0+cpu", "0.32.0+cpu"), ("0.320.1", None), ("1.0.0", None)]
    for installed, expected in [*cases, (None, None)]:
        assert vllm_cpu_fix.affected_version() == expected, installed
    assert set(asked) == {"vllm-cpu"}


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
