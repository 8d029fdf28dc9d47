"""The supported vLLM ranges (issue 48, item 1): declared once (vllm_releases.RANGES), stated in the
README, and a server's vLLM outside them reported at the snapshot, before any GPU work: a warning for
serving and the export (tests/data/units: the corpus's old container images), an error for extraction
when it will run the unit's own vLLM, naming the range and the setting that overrides it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eagle3_pipeline import vllm_releases
from eagle3_pipeline.hidden_states.vllm_backend import VllmBackendError, check_served_release
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.settings import HiddenStatesSettings, VllmEngineSettings

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.33.0", "0.34.0", "0.34.2rc1"])
def test_every_checked_release_is_inside_every_range(version):
    assert all(vllm_releases.check(use, version) is None for use in vllm_releases.RANGES)


def test_the_checked_releases_are_the_ones_the_ranges_cover():
    for release in vllm_releases.CHECKED_RELEASES:
        assert all(r.contains(release) for r in vllm_releases.RANGES.values())


@pytest.mark.parametrize("use", ["serve", "export"])
def test_serving_and_export_outside_their_range_warn_and_go_on(use):
    warning = vllm_releases.check(use, "0.35.0")
    assert "vLLM 0.35.0 is outside" in warning and ">=0.32,<0.35" in warning


def test_extraction_outside_its_range_is_an_error_naming_the_override():
    with pytest.raises(vllm_releases.UnsupportedVllmError, match="hidden_states.vllm.allow_untested_version"):
        vllm_releases.check("extract", "0.35.0")
    assert "0.35.0" in vllm_releases.check("extract", "0.35.0", allow_outside=True)


def _snapshot(version: str) -> ServerSnapshot:
    return ServerSnapshot.from_json({"model": "/m", "vllm_version": version})


def test_the_snapshot_refuses_a_served_vllm_extraction_would_run_outside_its_range():
    with pytest.raises(VllmBackendError, match=r"vLLM 0\.35\.0 is outside .*>=0\.32,<0\.35"):
        check_served_release(HiddenStatesSettings(), _snapshot("0.35.0"))
    check_served_release(HiddenStatesSettings(), _snapshot("0.34.0"))


@pytest.mark.parametrize(
    "hidden_states",
    [
        HiddenStatesSettings(backend="transformers"),
        HiddenStatesSettings(vllm=VllmEngineSettings(python="/opt/vllm-0.34/bin/python")),
        HiddenStatesSettings(vllm=VllmEngineSettings(allow_untested_version=True)),
    ],
)
def test_not_when_extraction_runs_another_vllm_or_the_override_is_set(hidden_states):
    check_served_release(hidden_states, _snapshot("0.35.0"))


def test_the_readme_states_each_declared_range():
    text = README.read_text()
    for use, supported in vllm_releases.RANGES.items():
        assert re.search(rf"\|\s*{use}\s*\|\s*`{re.escape(supported.spec)}`", text), use
