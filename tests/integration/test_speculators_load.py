"""The speculators library itself (vllm-project/speculators 0.9, in .venv-speculators: envs/install.sh
speculators) loads the exported speculators-format folder and drafts what the pipeline's draft drafts.

One process of the library's python (support/speculators_load.py) loads each folder with
`SpeculatorModel.from_pretrained` (its registry picks Eagle3DraftModel from config.json), takes the
embeddings from the verifier the config names, and runs its own teacher-forced TTT forward; its draft
tokens must be the pipeline's own draft's (the EAGLE checkpoint loaded by the offline check) at every
position and step. Drafts: plain EAGLE-3 (norm_before_residual false, which speculators must read from the
file) and two with EAGLE-3.1's options.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from support.requirements import SPECULATORS_PYTHON
from support.speculators_export import CASES, export_both

from eagle3_pipeline.draft.model import shift_left
from eagle3_pipeline.validate.offline import load_draft

pytestmark = pytest.mark.speculators

LOADER = Path(__file__).resolve().parents[1] / "support" / "speculators_load.py"
STEPS = 3


def test_speculators_loads_the_export_and_drafts_the_same_tokens(random_target, tmp_path):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (1, 24), generator=generator)
    aux = torch.randn(1, 24, 3 * 64, generator=generator) * 3
    # speculators' data reads token i+1 at row i in the first step (its shift_batch): pass it shifted
    save_file(
        {"aux_hidden_states": aux, "input_ids": shift_left(ids, 1), "steps": torch.tensor(STEPS)},
        str(tmp_path / "inputs.safetensors"),
    )
    args = []
    for name, options in CASES.items():
        export_both(random_target, tmp_path / name, options)
        args += [str(tmp_path / name / "speculators"), str(tmp_path / "inputs.safetensors")]
        args += [str(tmp_path / name / "drafted.safetensors")]
    run = subprocess.run(
        [str(SPECULATORS_PYTHON), str(LOADER), *args], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-4000:]
    for name, options in CASES.items():
        with safe_open(str(tmp_path / name / "drafted.safetensors"), "pt") as f:
            report, drafted = json.loads(f.metadata()["report"]), f.get_tensor("tokens")
            theirs = f.get_tensor("logits")  # [steps, T, Vd]
        assert report["class"] == "Eagle3DraftModel", name
        flags = {
            "norm_before_residual": False,
            "norm_before_fc": False,
            "fc_norm": False,
            "norm_output": False,
        }
        assert report["config"] == flags | options | {"draft_vocab_size": 40}, name
        assert report["verifier"] == str(random_target.resolve()) and report["layer_ids"] == [1, 2, 3]
        # every stored tensor loaded as stored; only what the verifier gives (and has now given) not stored
        assert report["not_loaded"] == [] and report["nan"] == [], name
        assert set(report["not_in_file"]) == {
            "embed_tokens.weight",
            "verifier_lm_head.weight",
            "verifier_norm.weight",
        }
        model, _ = load_draft(tmp_path / name / "checkpoint", random_target, torch.device("cpu"))
        with torch.no_grad():
            ours = torch.stack([logits[0] for logits in model(aux, ids, steps=STEPS)])  # [steps, T, Vd]
        rows = ids.shape[1] - STEPS  # the last rows read padding in the later steps
        # the same numbers up to float order (other attention kernels); a norm or a residual that differs
        # moves logits of this size (~2) by tenths
        gap = (theirs[:, :rows] - ours[:, :rows]).abs().max()
        assert gap < 5e-3, f"{name}: speculators' logits differ from the pipeline's by {gap}"
        assert torch.equal(drafted, theirs.argmax(-1)), name  # what it drafts is what those logits say
