"""Selection by acceptance (validate/selection.py) and the learning curve's points and trend
(validate/learning_curve.py): the pure rules, then one tiny training that keeps its epochs and a
selection over them on the random target's hidden states."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3_pipeline.draft.train import TrainJob, main
from eagle3_pipeline.validate.learning_curve import curve_points, curve_record, fit_trend, variant_name
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


def test_curve_points_are_nested_shard_counts_and_the_whole_is_the_main_draft():
    assert curve_points([0.25, 0.5, 1.0], 4) == {1: [0.25], 2: [0.5], 4: [1.0]}  # the demo's 4 shards
    assert curve_points([0.25, 0.5, 1.0], 3) == {1: [0.25], 2: [0.5], 3: [1.0]}  # at least the fraction
    assert curve_points([0.1, 0.2, 1.0], 4) == {1: [0.1, 0.2], 4: [1.0]}  # one point for one subset
    assert curve_points([], 4) == {}
    assert variant_name(4, 4) == "" and variant_name(1, 4) == "learning_curve/shards-00001/"
    with pytest.raises(ValueError, match="validate.learning_curve"):
        curve_points([0.0], 4)


def test_the_trend_is_the_gain_per_doubling_of_the_training_tokens():
    trend = fit_trend([1000, 2000, 4000], [2.0, 2.2, 2.4])
    assert trend["per_doubling"] == pytest.approx(0.2)
    assert trend["r2"] == pytest.approx(1.0)
    assert fit_trend([1000, 1000], [2.0, 2.2]) is None  # one token count: nothing to fit
    noisy = fit_trend([1000, 2000, 4000], [2.0, 1.9, 2.3])
    assert noisy["per_doubling"] == pytest.approx(0.15) and 0 < noisy["r2"] < 1  # reported as measured
    points = [
        {"training_tokens": 1000, "mean_accepted_length": 2.0},
        {"training_tokens": None, "mean_accepted_length": 9.0},  # no history: not fitted
        {"training_tokens": 4000, "mean_accepted_length": 2.4},
    ]
    assert curve_record(points, 3)["trend"]["per_doubling"] == pytest.approx(0.2)


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


def test_the_learning_curve_reads_each_points_files(tmp_path: Path):
    from eagle3_pipeline.validate.learning_curve import learning_curve

    points = []
    for k, tokens, tau in ((1, 5000, 1.8), (2, 10000, 2.0), (4, 20000, 2.2)):
        folder = tmp_path / str(k)
        folder.mkdir()
        lengths = [tau - 0.5, tau - 0.2, tau, tau + 0.1]
        (folder / "offline.json").write_text(
            json.dumps({"conditional": [0.5] * 4, "acceptance_length": lengths})
        )
        (folder / "history.json").write_text(
            json.dumps([{"epoch": e, "train": {"tokens": tokens}} for e in range(2)])
        )
        offline = {"epoch": 0, "conditional": [0.5] * 4, "acceptance_length": lengths}
        selection = {"chosen": {"epoch": 0}, "candidates": [offline]} if k == 2 else None  # its figures
        if selection:
            (folder / "selection.json").write_text(json.dumps(selection))
        points.append(
            {"shards": k, "fractions": [k / 4], "history": str(folder / "history.json"),
             "offline": str(folder / "offline.json"),
             "selection": str(folder / "selection.json") if selection else None}
        )  # fmt: skip
    record = learning_curve(points, 4, 3, tmp_path / "learning_curve.json")
    assert json.loads((tmp_path / "learning_curve.json").read_text()) == record
    assert [p["training_tokens"] for p in record["points"]] == [5000, 10000, 20000]
    assert [p["mean_accepted_length"] for p in record["points"]] == [1.8, 2.0, 2.2]  # at k = 3
    assert [p["epoch"] for p in record["points"]] == [1, 0, 1]  # the chosen epoch, else the last
    assert record["points"][2]["fraction_of_shards"] == 1.0
    assert record["trend"]["per_doubling"] == pytest.approx(0.2)
