"""vLLM's CPU build leaves the rejection sampler's expanded tensors unwritten: a fix that finds the fault.

Triton has no CPU backend, so vllm/platforms/cpu.py registers stand-ins from
vllm/utils/cpu_triton_utils.py (0.32 and 0.33; 0.34 removed the module, its x86 CPU path needs
triton-cpu). Its `_expand_kernel_impl` calls the C++ op on `_ensure_int64(output)`, which for any
output that is not int64 is a new int64 copy: the result never reaches `output`, which stays as
`new_empty` left it. The rejection sampler expands the per-request temperature and top_p (float32) and
top_k (int32) that way, so sampled speculative decoding verifies with garbage temperatures (greedy
returns before that code). docs/validation.md, "vLLM 0.32 CPU: sampled speculative decoding".

envs/install.sh writes a .pth file into .venv-vllm that loads this file by its path and calls
`install()` at every interpreter start. `install()` only puts a finder on sys.meta_path (no import of
vllm or torch); the finder acts on one module name, vllm.utils.cpu_triton_utils (imported only on the
CPU platform), whatever the distribution and version, and wraps its `_expand_kernel_impl` before
cpu.py registers it. The wrapper asks the kernel itself on its first call, when vLLM's C++ ops are
loaded: it expands two float values into a float tensor (`probe`); a kernel that leaves that tensor
unwritten is the faulty one, and every call from then on goes to the replacement (logged once); a
kernel that writes it keeps every call. Nothing is decided by a package name or a version, so a
release that fixes the kernel is left alone. EAGLE3_VLLM_CPU_FIX=0 turns it off.

Stdlib only at start: .venv-vllm does not see this package (pipeline-env.pth adds .venv's
site-packages, not the editable install's path), so the .pth loads this file on its own.
"""

from __future__ import annotations

import os
import sys

TARGET = "vllm.utils.cpu_triton_utils"
ENV_VAR = "EAGLE3_VLLM_CPU_FIX"  # 0 / false / no / off: leave vLLM as it is
# vLLM's logger tree: vLLM's handler prints the one line (the server's log says the fix is active)
LOGGER = "vllm.eagle3_pipeline_cpu_fix"
# the module and function this fix wraps, where it exists (vllm_compat.py checks the releases)
VLLM_NAMES = (
    ("name", "vllm.utils.cpu_triton_utils", "_expand_kernel_impl", {"below": "0.34"}),
    ("key", "vllm/platforms/cpu.py", "_expand_kernel_impl", {"below": "0.34"}),  # registered from there
)


def enabled() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() not in {"0", "false", "no", "off"}


def probe(kernel) -> bool:
    """True when `kernel` (an `_expand_kernel_impl`) leaves a float output unwritten: the fault.

    Expands [0.6, 0.9] over cu [3, 6] into a float32 tensor of zeros, as the sampler expands its
    temperatures; the Triton kernel's values are [0.6] * 3 + [0.9] * 3.
    """
    import torch

    output = torch.zeros(6, dtype=torch.float32)
    kernel(output, torch.tensor([0.6, 0.9]), torch.tensor([3, 6], dtype=torch.int32), 0, 0, 128)
    return not torch.allclose(output, torch.tensor([0.6] * 3 + [0.9] * 3))


def fixed_expand(original):
    """`_expand_kernel_impl` writing into `output` for every dtype (the Triton `expand_kernel`'s rule).

    out[cu[i-1]:cu[i]] = replace_to if x[i] == replace_from else x[i], at most MAX_NUM_TOKENS per
    request. An int64 output goes to vLLM's own C++ op (correct there: it writes in place).
    """

    def expand_kernel_impl_fixed(
        output,
        input_val,
        cu_num_tokens,
        replace_from,
        replace_to,
        MAX_NUM_TOKENS=None,
    ):
        import torch  # loaded already (vLLM's module imports it); here, patching needs no torch

        if output.dtype == torch.int64:
            return original(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS)
        num_reqs = input_val.shape[0]
        if num_reqs == 0:
            return None
        ends = cu_num_tokens[:num_reqs].to(device=output.device, dtype=torch.int64)
        starts = torch.cat([ends.new_zeros(1), ends[:-1]])
        counts = (ends - starts).clamp(min=0)
        if MAX_NUM_TOKENS is not None:
            counts = counts.clamp(max=int(MAX_NUM_TOKENS))
        values = input_val.masked_fill(input_val == replace_from, replace_to)
        request = torch.repeat_interleave(torch.arange(num_reqs, device=output.device), counts)
        first = torch.cumsum(counts, 0) - counts  # where each request's run starts in `request`
        offset = torch.arange(request.numel(), device=output.device) - first[request]
        output[starts[request] + offset] = values[request].to(output.dtype)
        return None

    expand_kernel_impl_fixed.eagle3_original = original
    return expand_kernel_impl_fixed


def checked_expand(original, name: str):
    """`original`, asked on its first call (`probe`) and replaced by `fixed_expand` when faulty."""
    chosen = []

    def expand_kernel_impl_checked(*args, **kwargs):
        if not chosen:
            faulty = probe(original)
            chosen.append(fixed_expand(original) if faulty else original)
            if faulty:
                import logging

                logging.getLogger(LOGGER).info(
                    "eagle3_pipeline: %s._expand_kernel_impl writes no float or int32 output (probed): "
                    "replaced (%s=0 turns this off)",
                    name,
                    ENV_VAR,
                )
        return chosen[0](*args, **kwargs)

    expand_kernel_impl_checked.eagle3_original = original
    expand_kernel_impl_checked.eagle3_chosen = chosen  # what the probe chose, once it ran
    return expand_kernel_impl_checked


def patch(module) -> bool:
    """Wrap `module._expand_kernel_impl` in `checked_expand` (once); True when wrapped."""
    original = getattr(module, "_expand_kernel_impl", None)
    if original is None or hasattr(original, "eagle3_original"):
        return False
    module._expand_kernel_impl = checked_expand(original, module.__name__)
    return True


class _PatchingLoader:
    """The real loader, with `patch` run right after the module's code; the finder leaves then (a
    bare `importlib.util.find_spec` of TARGET, which loads nothing, must not use it up)."""

    def __init__(self, loader, finder):
        self._loader, self._finder = loader, finder

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        patch(module)
        self._finder.remove()

    def __getattr__(self, name):
        return getattr(self._loader, name)


class Finder:
    """On sys.meta_path: sees only TARGET's import, wraps its kernel there, then leaves."""

    eagle3_vllm_cpu_fix = True  # how install() knows one is there (the .pth's copy of this module or not)

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        if not enabled():
            self.remove()
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(fullname, path, target) if finder is not self and find_spec else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, self)
                return spec
        return None

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def install() -> Finder | None:
    """At interpreter start (the .pth file): the finder, unless turned off or already there."""
    if not enabled() or any(getattr(finder, "eagle3_vllm_cpu_fix", False) for finder in sys.meta_path):
        return None
    finder = Finder()
    sys.meta_path.insert(0, finder)
    return finder
