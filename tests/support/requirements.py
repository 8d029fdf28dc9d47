"""What a test tier needs that a machine may lack, and the one place that says why a test is skipped.

tests/conftest.py skips a test marked `vllm`, `speculators`, `ssh` or `gpu` with the reason below when
the machine lacks it; a session fixture that starts one of these services calls `require` first, so a
test that takes the fixture skips with the same reason even without the marker.
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


def _gpu() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "needs a CUDA device"


CHECKS: dict[str, Callable[[], str | None]] = {
    "vllm": _vllm,
    "speculators": _speculators,
    "ssh": _ssh,
    "gpu": _gpu,
}


def missing(need: str) -> str | None:
    """Why `need` (a key of CHECKS) cannot run on this machine; None when it can."""
    return CHECKS[need]()


def require(need: str) -> None:
    """Skip the calling test (or fixture) with the reason when `need` is missing here."""
    reason = missing(need)
    if reason:
        pytest.skip(reason)
