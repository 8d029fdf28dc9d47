"""A draft exported in both formats (EAGLE checkpoint/ and speculators/), for the tests that read the
speculators folder with the speculators library or with vLLM's readers
(tests/integration/test_speculators_*.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from support.draft import build_vocab_map_for

from eagle3_pipeline.draft.export import export_checkpoint
from eagle3_pipeline.draft.model import Eagle3Draft
from eagle3_pipeline.draft_config import draft_config_from_target, read_target_config


def export_model(
    model: Eagle3Draft, random_target: Path, folder: Path, aux_layers: list[int], speculative_tokens: int = 3
) -> tuple[dict, dict]:
    """`model` through the export stage into folder/checkpoint (EAGLE) and folder/speculators, with the
    shard metadata naming `aux_layers` (vLLM's ids one higher) and a vocabulary map of the target's;
    returns both config.json files."""
    folder.mkdir(parents=True, exist_ok=True)
    metadata = folder / "shard-00000.json"
    vllm_layers = [k + 1 for k in aux_layers]
    metadata.write_text(json.dumps({"aux_layers": aux_layers, "aux_layers_vllm": vllm_layers}))
    build_vocab_map_for(random_target, folder)
    meta = {"draft_config": json.dumps(model.config.to_dict())}
    save_file(model.exported_state_dict(), str(folder / "trained.safetensors"), metadata=meta)
    export_checkpoint(
        folder / "trained.safetensors",
        folder / "vocab.safetensors",
        random_target / "config.json",
        metadata,
        folder / "checkpoint" / "config.json",
        folder / "checkpoint" / "model.safetensors",
        speculators_dir=folder / "speculators",
        speculative_tokens=speculative_tokens,
    )
    eagle, speculators = (folder / fmt / "config.json" for fmt in ("checkpoint", "speculators"))
    return json.loads(eagle.read_text()), json.loads(speculators.read_text())


def export_both(random_target: Path, folder: Path, options: dict[str, bool]) -> None:
    """A random draft (its norms off one, so that a norm dropped or added shows) exported in both formats."""
    config = draft_config_from_target(read_target_config(random_target), 40, **options)
    torch.manual_seed(0)
    model = Eagle3Draft(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    # distinct layers: speculators checks them against the verifier
    export_model(model, random_target, folder, aux_layers=[0, 1, 2])


# EAGLE-3 and EAGLE-3.1 drafts those tests export (all three options covered)
CASES = {
    "eagle3": {},
    "norm_before_fc+norm_output": {"norm_before_fc": True, "norm_output": True},
    "fc_norm": {"fc_norm": True},
}
