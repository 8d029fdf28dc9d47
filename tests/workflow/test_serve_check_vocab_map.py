"""The serve check catches a draft served with another vocabulary map than it was trained with: the
session's demo draft (support.workflow.demo_e2e_workdir, trained and checked by the run itself) copied
with its d2t shifted by one (draft id i mapped to the target id meant for i + 1), served by real vLLM
through the rule's entry against the run's own offline.json. One vLLM start; no training of its own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from support.served_drafts import local_unit
from support.workflow import merge

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def shifted_vocab_map(checkpoint: Path) -> None:
    """Rewrite the checkpoint's d2t so that draft id i maps to used[i + 1] (used[i] = i + d2t[i])."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(checkpoint / "model.safetensors")
    d2t = tensors["d2t"]
    tensors["d2t"] = torch.roll(d2t, -1) + 1  # i + d2t'[i] = (i + 1) + d2t[i + 1]
    save_file(tensors, checkpoint / "model.safetensors", metadata={"format": "pt"})


def test_a_draft_served_with_a_wrong_vocabulary_map_fails_the_check(demo_e2e_workdir: Path, tmp_path: Path):
    from eagle3_pipeline.validate.serve_check import ServeCheckError, serve_check

    results = demo_e2e_workdir / "results" / "e2e"
    config = merge(
        yaml.safe_load((demo_e2e_workdir / "config" / "config.yaml").read_text()),
        yaml.safe_load((demo_e2e_workdir / "e2e.yaml").read_text()),
    )
    passed = json.loads((results / "validation" / "serve_check.json").read_text())
    assert passed["offline_comparison"]["agree"] and passed["offline_comparison"]["enforced"]

    wrong = shutil.copytree(results / "draft" / "checkpoint", tmp_path / "checkpoint")
    shifted_vocab_map(wrong)
    target = demo_e2e_workdir / "resources" / "demo" / "target"
    with pytest.raises(ServeCheckError, match="does not behave like the trained one"):
        serve_check(
            wrong,
            results / "traces" / "validation.parquet",
            results / "server" / "server.json",
            local_unit(target, tmp_path / "unit.service"),
            config["generation"],
            config["validate"] | {"speedup": False},
            tmp_path / "work",
            tmp_path / "serve_check.json",
            results / "validation" / "offline.json",
        )
    rejected = json.loads((tmp_path / "work" / "serve_check.rejected.json").read_text())
    first = rejected["offline_comparison"]["positions"][0]
    assert first["served"] < first["offline"] - first["allowed"], first
    assert not (tmp_path / "serve_check.json").exists()
