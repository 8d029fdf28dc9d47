"""The suite's own guard (support.requirements): on a developer's machine a missing requirement skips
with its reason; under CI=true it fails, so that a runner without the vLLM environment, sshd or root
cannot pass green with whole tiers skipped. Only the GPU, which CI never has, still skips."""

from __future__ import annotations

import os

import pytest
from _pytest.outcomes import Failed, Skipped
from support import requirements


@pytest.mark.parametrize("ci", ["", "true"])
def test_a_non_root_runner_skips_the_ssh_tier_locally_and_fails_it_on_ci(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os.path, "exists", lambda path: True)  # sshd installed
    monkeypatch.setattr(requirements.shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(Failed if ci else Skipped, match="needs root"):
        requirements.require("ssh")


@pytest.mark.parametrize("ci", ["", "true"])
def test_a_missing_vllm_environment_skips_locally_and_fails_on_ci(monkeypatch, tmp_path, ci):
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(requirements, "VLLM_PYTHON", tmp_path / "no-venv" / "bin" / "python")
    with pytest.raises(Failed if ci else Skipped, match="make install-vllm"):
        requirements.require("vllm")
    monkeypatch.setattr(requirements, "SPECULATORS_PYTHON", tmp_path / "none")
    with pytest.raises(Failed if ci else Skipped, match="make install-speculators"):
        requirements.require("speculators")


def test_no_gpu_skips_even_on_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setitem(requirements.CHECKS, "gpu", lambda: "needs a CUDA device")
    with pytest.raises(Skipped, match="CUDA"):
        requirements.require("gpu")


def test_every_service_fixture_names_a_known_requirement():
    assert set(requirements.FIXTURE_NEEDS.values()) <= set(requirements.CHECKS)
