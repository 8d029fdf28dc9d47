"""Selection by acceptance (validate/selection.py): the pure rules, then one tiny training that keeps its
epochs and a selection over them on the random target's hidden states; the selection figure beside the
learning curve's (the learning curve itself: tests/unit/test_validate_learning_curve.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3_pipeline.draft.train import TrainJob, main
from eagle3_pipeline.validate.learning_curve import curve_record
from eagle3_pipeline.validate.selection import choose, criterion_k, kept_epochs, select_checkpoint


def test_kept_epochs_are_every_nth_and_always_the_last():
    assert kept_epochs(10, 1) == list(range(10))
    assert kept_epochs(10, 3) == [2, 5, 8, 9]
    assert kept_epochs(4, 10) == [3]
    assert kept_epochs(10, 0) == []  # off: the last epoch's weights are exported as trained
    assert criterion_k(3, 7) == 3 and criterion_k(9, 7) == 7


def _candidate(epoch: int, tau_at_3: float) -> dict:
    return {"epoch": epoch, "acceptance_length": [1.5, 2.0, tau_at_3, tau_at_3 + 0.1]}


def test_the_longest_acceptance_at_k_is_chosen_not_the_last_epoch():
    candidates = [_candidate(0, 2.1), _candidate(1, 2.6), _candidate(2, 2.4)]
    chosen = choose(candidates, 3)
    assert chosen["epoch"] == 1
    assert chosen["acceptance_length"] == 2.6 and chosen["last_epoch_acceptance_length"] == 2.4
    assert "epoch 2 has" in chosen["reason"] and "+0.200 over the last epoch (3:" in chosen["reason"]


def test_a_tie_goes_to_the_later_epoch_and_the_last_says_so():
    chosen = choose([_candidate(0, 2.5), _candidate(1, 2.5)], 3)
    assert chosen["epoch"] == 1
    assert chosen["reason"].startswith("the last epoch (2)")  # counted from 1
    with pytest.raises(ValueError, match="select_every_epochs"):
        choose([], 3)


def test_training_keeps_its_epochs_and_the_best_one_is_exported(
    draft_train_job: TrainJob, random_target: Path, draft_hidden_states, tmp_path: Path
):
    epochs = tmp_path / "epochs"
    job = replace(
        draft_train_job,
        train=replace(draft_train_job.train, epochs=2),
        checkpoint_epochs=[0, 1],
        checkpoints=[str(epochs / "epoch-000.safetensors"), str(epochs / "epoch-001.safetensors")],
    )
    assert main(job)
    first, last, final = (load_file(p) for p in (*job.checkpoints, job.weights))
    assert all(torch.equal(last[k], final[k]) for k in final)  # the last kept epoch is the final draft
    assert not torch.equal(first["fc.weight"], last["fc.weight"])
    record = select_checkpoint(
        checkpoints=job.checkpoints,
        epochs=[0, 1],
        history_path=job.history,
        vocab_map=job.vocab_map,
        target_config=random_target / "config.json",
        hidden_states_metadata=draft_hidden_states["train"][0].with_suffix(".json"),
        validation_states=[str(p) for p in draft_hidden_states["validation"]],
        steps=3,
        num_speculative_tokens=3,
        every=1,
        output_weights=tmp_path / "selected" / "model.safetensors",
        output_selection=tmp_path / "selection.json",
    )
    assert json.loads((tmp_path / "selection.json").read_text()) == record
    assert [c["epoch"] for c in record["candidates"]] == [0, 1]
    assert record["candidates"][0]["train_loss"] > record["candidates"][1]["train_loss"]
    best = max(record["candidates"], key=lambda c: (c["acceptance_length"][2], c["epoch"]))
    assert record["chosen"]["epoch"] == best["epoch"]
    chosen = load_file(job.checkpoints[best["epoch"]])
    selected = load_file(tmp_path / "selected" / "model.safetensors")
    assert all(torch.equal(chosen[k], selected[k]) for k in chosen)
    assert not list((tmp_path / "selected").glob("select-*"))  # the scratch exports are gone


def test_the_selection_and_learning_curve_figures_are_drawn(tmp_path: Path):
    from PIL import Image

    from eagle3_pipeline.validate.report_curves import draw_curves

    candidates = [
        _candidate(e, tau) | {"train_loss": 9.0 - e, "validation_loss": 9.5 - e}
        for e, tau in enumerate([2.0, 2.5, 2.4])
    ]
    selection = {"k": 3, "chosen": choose(candidates, 3), "candidates": candidates}
    points = [
        {"shards": k, "training_tokens": 5000 * k, "mean_accepted_length": 2.0 + 0.1 * k} for k in (1, 2, 4)
    ]
    curve = curve_record(points, 3)
    inputs = {"selection": tmp_path / "selection.json", "learning_curve": tmp_path / "learning_curve.json"}
    inputs["selection"].write_text(json.dumps(selection))
    inputs["learning_curve"].write_text(json.dumps(curve))
    outputs = {name: str(tmp_path / f"{name}.png") for name in inputs}
    draw_curves({k: str(v) for k, v in inputs.items()}, outputs)
    for path in outputs.values():
        assert Image.open(path).size[0] > 500
