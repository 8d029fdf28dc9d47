"""What a test tier needs that a machine may lack, and the one place that says why a test is skipped.

tests/conftest.py skips a test marked `vllm`, `speculators`, `ssh`, `slurm` or `gpu` with the reason
below when the machine lacks it; a session fixture that starts one of these services calls `require`
first, so a test that takes the fixture skips with the same reason (and conftest refuses, at
collection, a test that takes such a fixture without the marker: FIXTURE_NEEDS).

Under `CI=true` (how .ci/run is run) a missing requirement FAILS the test instead: CI installs and
starts everything the tiers need, so a skip there would hide a broken install step (a runner with
sshd but not root once skipped every SSH test and stayed green). Only `gpu` still skips: CI has none.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
SPECULATORS_PYTHON = REPO / ".venv-speculators" / "bin" / "python"
SSHD = "/usr/sbin/sshd"


def _vllm() -> str | None:
    return (
        None
        if VLLM_PYTHON.exists()
        else f"{VLLM_PYTHON} missing: install the vLLM CPU build (make install-vllm)"
    )


def _speculators() -> str | None:
    return (
        None
        if SPECULATORS_PYTHON.exists()
        else f"{SPECULATORS_PYTHON} missing: install the speculators library's test environment "
        "(make install-speculators)"
    )


def _ssh() -> str | None:
    if not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None:
        return "needs OpenSSH's sshd and ssh-keygen (Debian: apt-get install -y openssh-server)"
    if os.geteuid() != 0:
        return "the sshd test server needs root (privilege separation)"
    return None


def _systemd() -> str | None:
    from support.real_systemd import why_not_here

    return why_not_here()


def _vllm_wheels() -> str | None:
    from eagle3_pipeline.vllm_compat import DEFAULT_CACHE
    from eagle3_pipeline.vllm_releases import CHECKED_RELEASES

    absent = [r for r in CHECKED_RELEASES if not any(DEFAULT_CACHE.glob(f"vllm-{r}-*.whl"))]
    return (
        f"no cached vLLM wheel of {', '.join(absent)} in {DEFAULT_CACHE}: make vllm-compat downloads them"
        if absent
        else None
    )


def _slurm() -> str | None:
    tools = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch")
    absent = [tool for tool in tools if not Path(tool).exists()]
    if absent:
        return (
            f"needs Debian's slurmctld, slurmd, slurm-client and munge (.ci/run installs them): no {absent}"
        )
    return None if os.geteuid() == 0 else "needs root (slurmd runs each job as its user)"


def _gpu() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "needs a CUDA device"


CHECKS: dict[str, Callable[[], str | None]] = {
    "vllm": _vllm,
    "speculators": _speculators,
    "ssh": _ssh,
    "systemd": _systemd,
    "slurm": _slurm,
    "gpu": _gpu,
    "vllm_wheels": _vllm_wheels,  # the supported releases' wheels, read by tests/unit/test_vllm_compat.py
}


# what CI never has, so a test needing it skips there too
OPTIONAL_ON_CI = frozenset({"gpu"})

# session and module fixtures that start a service -> the marker a test taking them must carry
FIXTURE_NEEDS: dict[str, str] = {
    "demo_vllm_server": "vllm",  # support.vllm_server
    "vllm_server": "vllm",  # support.generation_server
    "served_trained_draft": "vllm",  # support.served_drafts
    "demo_e2e_workdir": "vllm",  # support.workflow
    "sshd_server": "ssh",  # support.sshd
    "systemd_host": "systemd",  # support.systemd_box
    "slurm_cluster": "slurm",  # support.slurm
}


def on_ci() -> bool:
    """True under .ci/run (CI=true), where a missing requirement is a failure, not a skip."""
    return os.environ.get("CI", "").lower() in {"true", "1", "yes"}


def missing(need: str) -> str | None:
    """Why `need` (a key of CHECKS) cannot run on this machine; None when it can."""
    return CHECKS[need]()


def require(need: str) -> None:
    """Skip the calling test (or fixture) with the reason when `need` is missing here; under CI=true
    fail it instead (but for OPTIONAL_ON_CI)."""
    reason = missing(need)
    if reason:
        unavailable(need, reason)


def unavailable(need: str, reason: str) -> None:
    """Skip (a developer's machine) or fail (CI, see the module docstring) for a missing `need`."""
    if on_ci() and need not in OPTIONAL_ON_CI:
        pytest.fail(f"CI=true and the machine lacks what `{need}` tests need: {reason}", pytrace=False)
    pytest.skip(reason)
