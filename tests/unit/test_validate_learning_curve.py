"""The learning curve at equal compute (validate/learning_curve.py): each point's epoch its shards
cycled to the full draft's count (planning/variants.py; a real tiny training shows the steps match),
the points' intervals and the paired gains between them on the per-question replays, no straight-line
trend; and its figure (validate/report_curves.py)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from eagle3_pipeline.planning.variants import cycled_shards
from eagle3_pipeline.validate.learning_curve import (
    COMPUTE_RULE,
    curve_record,
    fit_log_odds,
    learning_curve,
    paired_gain,
    passes_per_epoch,
)


def test_a_points_passes_per_epoch_are_the_fewest_and_most_reads_of_one_of_its_shards():
    assert passes_per_epoch(2, 4) == [2, 2] and passes_per_epoch(3, 4) == [1, 2]


def test_a_point_trained_on_its_shards_cycled_takes_the_full_drafts_optimizer_steps(
    draft_train_job, tmp_path: Path
):
    """The real trainer: the full draft on both fixture shards, a point on the first one alone as it was
    trained before (the same epochs: half the steps) and as it is now (cycled to two: the same steps)."""
    from eagle3_pipeline.draft.train import main

    def steps(name: str, shards: list[str]) -> int:
        job = replace(
            draft_train_job,
            train_shards=shards,
            validation_shards=[],
            work=str(tmp_path / name / "work"),
            weights=str(tmp_path / name / "model.safetensors"),
            history=str(tmp_path / name / "history.json"),
        )
        assert main(job)
        history = json.loads(Path(job.history).read_text())
        assert len(history) == draft_train_job.train.epochs
        return history[-1]["step"]

    full = steps("full", draft_train_job.train_shards)
    same_epochs = steps("same-epochs", draft_train_job.train_shards[:1])
    equal = steps("equal-steps", cycled_shards(draft_train_job.train_shards, 1))
    assert same_epochs < 0.7 * full  # what the curve measured before: compute, not data
    assert abs(equal - full) <= 0.2 * full, (equal, full)  # 12 + 12 random-length samples: a batch or so


def test_the_log_odds_fit_needs_three_points_and_holds_only_in_the_measured_range():
    tokens = [1000, 2000, 4000]
    # logit(rate) = -1 + 0.5 log2(tokens / 1000) at position 1; position 2 reaches 1.0 (no log-odds)
    rates = [[1 / (1 + math.exp(-(-1 + 0.5 * i))), 0.5 + 0.25 * i] for i in range(3)]
    fit = fit_log_odds(tokens, rates)
    assert fit["slope_per_doubling"][0] == pytest.approx(0.5, abs=1e-3)
    assert fit["slope_per_doubling"][1] is None  # a rate of 1: no finite log-odds, no slope
    assert fit["training_tokens_range"] == [1000, 4000] and fit["extrapolate"] is False
    assert fit_log_odds(tokens[:2], rates[:2]) is None  # two points: nothing beyond the points


def _rows(base: list[tuple[int, list[int]]], extra: int = 0) -> dict[str, tuple[int, list[int]]]:
    return {f"q{i}": (d, [min(d, n + extra) for n in counts]) for i, (d, counts) in enumerate(base)}


def test_the_paired_gain_cancels_question_difficulty():
    """Easy and hard questions (everything or little accepted), and the bigger point accepting one more
    draft token at each position of every question: a small, certain gain under a spread between
    questions that, taken unpaired, would swamp it."""
    base = [(20, [18, 16, 14])] * 10 + [(20, [3, 1, 0])] * 10
    before, after = _rows(base), _rows(base, extra=1)
    gain = paired_gain(before, after, 3)
    expected = 3 * 20 / 400  # one more accepted per position per question, over 400 drafts
    assert gain["gain"] == pytest.approx(expected, abs=1e-4)
    low, high = gain["ci95"]
    assert 0 < low <= gain["gain"] <= high
    assert high - low < 0.5 * expected  # paired: the questions' spread cancels
    assert gain["per_position_rate"]["difference"] == pytest.approx([0.05, 0.05, 0.05], abs=1e-4)
    assert gain["questions"] == 20 and gain["unit"] == "question"
    assert paired_gain(before, before, 3)["ci95"] == [0.0, 0.0]
    assert paired_gain({"q0": before["q0"]}, {"q0": after["q0"]}, 3) is None  # one question: no interval
    assert paired_gain(before, {"x": (1, [1, 1, 1])}, 3) is None  # no question in common


def _offline(tau: float, extra: int, ci: float = 0.1) -> dict:
    lengths = [tau - 0.5, tau - 0.2, tau, tau + 0.1]
    base = [(20, [12, 8, 5])] * 6 + [(20, [4, 2, 1])] * 6
    samples = {
        question: {"greedy": {"drafts": d, "accepted_per_position": n}, "sampled": None}
        for question, (d, n) in _rows(base, extra).items()
    }
    return {
        "conditional": [0.6, 0.5, 0.4, 0.3],
        "acceptance_length": lengths,
        "ci95": [[x - ci, x + ci] for x in lengths],
        "served_replay": {"num_speculative_tokens": 3, "samples": samples},
    }


def _point_files(tmp_path: Path, k: int, tau: float, extra: int, steps: int, selected: bool) -> dict:
    folder = tmp_path / str(k)
    folder.mkdir()
    (folder / "offline.json").write_text(json.dumps(_offline(tau, extra)))
    history = [{"epoch": e, "step": steps * (e + 1) // 2, "train": {"tokens": 5000 * 4}} for e in range(2)]
    (folder / "history.json").write_text(json.dumps(history))
    files = {
        "shards": k,
        "fractions": [k / 4],
        "history": str(folder / "history.json"),
        "offline": str(folder / "offline.json"),
        "selection": None,
    }
    if selected:  # the chosen epoch's figures: offline.json is its export's
        selection = {"chosen": {"epoch": 0}, "candidates": [{"epoch": 0} | _offline(tau, extra)]}
        (folder / "selection.json").write_text(json.dumps(selection))
        files["selection"] = str(folder / "selection.json")
    return files


def test_the_learning_curve_records_equal_steps_intervals_and_paired_gains(tmp_path: Path):
    points = [
        _point_files(tmp_path, 1, 1.8, 0, 98, selected=False),
        _point_files(tmp_path, 2, 2.0, 1, 101, selected=True),
        _point_files(tmp_path, 4, 2.2, 2, 100, selected=False),
    ]
    metadata = []
    for shard in range(4):
        metadata.append(tmp_path / f"shard-{shard:05d}.json")
        metadata[-1].write_text(json.dumps({"num_loss_tokens": 5000 + shard}))
    output = tmp_path / "learning_curve.json"
    record = learning_curve(points[::-1], 4, 3, output, points[2]["history"], metadata, epochs=2)
    assert json.loads(output.read_text()) == record
    assert "trend" not in record  # no gain per doubling: acceptance length is capped
    assert [p["shards"] for p in record["points"]] == [1, 2, 4]
    assert [p["training_tokens"] for p in record["points"]] == [5000, 10001, 20006]  # their own shards
    assert [p["optimizer_steps"] for p in record["points"]] == [98, 101, 100]
    assert [p["epochs"] for p in record["points"]] == [8, 4, 2]  # passes over their own data
    assert [p["training_epochs"] for p in record["points"]] == [2, 2, 2]
    assert [p["epoch"] for p in record["points"]] == [1, 0, 1]  # the chosen epoch, else the last
    assert record["points"][1]["step"] == 50  # the chosen epoch's
    compute = record["compute"]
    assert compute["rule"] == COMPUTE_RULE == "equal optimizer steps to the full draft"
    assert compute["full_draft_optimizer_steps"] == 100
    assert [p["steps_ratio"] for p in record["points"]] == [0.98, 1.01, 1.0]
    assert compute["within_tolerance"] is True
    for p, tau in zip(record["points"], (1.8, 2.0, 2.2), strict=True):
        assert p["mean_accepted_length"] == tau
        assert p["ci95"] == [pytest.approx(tau - 0.1), pytest.approx(tau + 0.1)]  # at k = 3
        low, high = p["replayed"]["greedy"]["ci95"]
        assert low <= p["replayed"]["greedy"]["acceptance_length"] <= high
        assert "sampled" not in p["replayed"]  # none measured
    assert [(g["from_shards"], g["to_shards"]) for g in record["gains"]] == [(1, 2), (2, 4)]
    for gain in record["gains"]:
        assert gain["gain"] == pytest.approx(0.2)
        paired = gain["replayed"]["greedy"]
        assert paired["gain"] == pytest.approx(3 * 6 / 240 + 3 * 6 / 240, abs=1e-3)  # one more per position
        assert 0 < paired["ci95"][0] <= paired["gain"] <= paired["ci95"][1]
        assert paired["questions"] == 12
    assert record["fit"]["slope_per_doubling"] == [0.0, 0.0, 0.0]  # the same rates at every point
    assert record["fit"]["training_tokens_range"] == [5000, 20006]

    two = learning_curve(points[:1] + points[2:], 4, 3, output, points[2]["history"], metadata, epochs=2)
    assert two["fit"] is None and "no fit" in two["fit_note"]


def test_the_steps_are_flagged_when_a_point_strays_and_files_without_replays_say_so(tmp_path: Path):
    points = [_point_files(tmp_path, 1, 1.8, 0, 80, False), _point_files(tmp_path, 4, 2.2, 1, 100, False)]
    for p in points:  # offline.json as written before the intervals
        offline = json.loads(Path(p["offline"]).read_text())
        Path(p["offline"]).write_text(
            json.dumps({k: offline[k] for k in ("conditional", "acceptance_length")})
        )
    record = learning_curve(points, 4, 3, tmp_path / "curve.json", points[1]["history"])
    assert [p["steps_ratio"] for p in record["points"]] == [0.8, 1.0]
    assert record["compute"]["within_tolerance"] is False
    assert record["points"][0]["ci95"] is None and record["points"][0]["replayed"] is None
    gain = record["gains"][0]
    assert gain["gain_ci95"] is None and "no paired interval" in gain["gain_ci95_note"]
    # no metadata: one epoch's tokens over its passes (the history's 20,000 over 4 for one of 4 shards)
    assert [p["training_tokens"] for p in record["points"]] == [5000, 20000]


def test_the_learning_curve_figure_draws_intervals_on_a_token_axis(tmp_path: Path):
    from support.figures import read_figure_text

    from eagle3_pipeline.validate.report_curves import learning_curve_figure

    points = [
        {
            "shards": k,
            "training_tokens": 5000 * k,
            "optimizer_steps": 100,
            "conditional": [0.5 + 0.05 * k, 0.4, 0.3],
            "mean_accepted_length": 2.0 + 0.1 * k,
            "ci95": [1.9 + 0.1 * k, 2.1 + 0.1 * k],
            "replayed": {
                "greedy": {"acceptance_length": 1.9 + 0.1 * k, "ci95": [1.8 + 0.1 * k, 2.0 + 0.1 * k]}
            },
        }
        for k in (1, 2, 4)
    ]
    gains = [
        {
            "from_shards": 1,
            "to_shards": 2,
            "gain": 0.1,
            "replayed": {"greedy": {"gain": 0.1, "ci95": [-0.02, 0.2]}},
        },
        {"from_shards": 2, "to_shards": 4, "gain": 0.2},
    ]
    curve = curve_record(points, 3, gains, {"rule": COMPUTE_RULE, "full_draft_optimizer_steps": 100})
    (tmp_path / "curve.json").write_text(json.dumps(curve))
    learning_curve_figure(tmp_path / "curve.json", tmp_path / "curve.png")
    (panel,) = read_figure_text(tmp_path / "curve.png")
    assert "every point at 100 optimizer steps" in panel["title"]
    assert "1 -> 2 shards: +0.10 offline (replayed +0.10 [-0.02, +0.20])" in panel["title"]
    assert "per doubling" not in panel["title"]
    assert panel["xlabel"].startswith("training tokens")
    assert any("95% CI" in entry for entry in panel["legend"])
    # a curve written by the builders with the fewest fields (tests/support/validate_results.py)
    bare = [{"shards": k, "training_tokens": 5000 * k, "mean_accepted_length": 2.0 + 0.1 * k} for k in (1, 2)]
    (tmp_path / "bare.json").write_text(json.dumps(curve_record(bare, 3)))
    learning_curve_figure(tmp_path / "bare.json", tmp_path / "bare.png")
    assert read_figure_text(tmp_path / "bare.png")[0]["title"].startswith("Acceptance length")
