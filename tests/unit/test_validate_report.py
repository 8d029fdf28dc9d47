"""The report's pictures from a tiny finished results tree, and the baseline traces."""

import json
from pathlib import Path

import polars as pl
import pytest
from PIL import Image
from support.figures import read_figure_text
from support.validate_results import write_finished_results

from eagle3_pipeline.validate.baseline import BaselineError, baseline_frame, write_baseline_traces
from eagle3_pipeline.validate.report import draw_report

NAMES = {
    "server": "server.html",
    "trace_stats": "trace_stats.html",
    "trace_lengths": "trace_lengths.png",
    "training": "training.png",
    "acceptance": "acceptance.png",
    "comparison": "comparison.png",
    "slices": "slices.png",
}


@pytest.mark.parametrize("baseline", [True, False])
def test_every_picture_is_drawn(tmp_path, baseline):
    inputs = {k: str(v) for k, v in write_finished_results(tmp_path / "results", baseline).items()}
    outputs = {k: str(tmp_path / "report" / v) for k, v in NAMES.items()}
    draw_report(inputs, outputs)
    for key in ("trace_lengths", "training", "acceptance", "comparison", "slices"):
        with Image.open(outputs[key]) as image:
            assert image.size[0] > 600 and image.size[1] > 300
    page = (tmp_path / "report" / "server.html").read_text()
    assert "kimi_k2" in page and "&lt;redacted&gt;" in page and "ExecStart=" in page
    assert "dropped.empty" in (tmp_path / "report" / "trace_stats.html").read_text()


def _panel(path: str, title_start: str) -> dict:
    return next(p for p in read_figure_text(path) if p["title"].startswith(title_start))


@pytest.mark.parametrize("agree", [True, False])
def test_the_pictures_say_the_checks_verdict_and_the_served_figures(tmp_path, agree):
    """What the report's figures claim is read back from them (the words each PNG carries): the served
    check's verdict as serve_check.json states it, both drafts' served acceptance lengths, every
    dataset source's value, and labelled axes."""
    inputs = {k: str(v) for k, v in write_finished_results(tmp_path / "results", True).items()}
    serve_path = Path(inputs["serve_check"])
    serve = json.loads(serve_path.read_text())
    serve["sampled_comparison"]["agree"] = agree  # the enforced pair
    serve["offline_comparison"]["agree"] = not agree  # the greedy diagnostic says the opposite
    serve_path.write_text(json.dumps(serve))
    outputs = {k: str(tmp_path / "report" / v) for k, v in NAMES.items()}
    draw_report(inputs, outputs)
    checked = _panel(outputs["acceptance"], "First i+1 draft tokens accepted")
    assert ("checked pair (sampled) agree" in checked["title"]) is agree
    assert ("checked pair (sampled) DISAGREE" in checked["title"]) is not agree
    assert checked["ylabel"] == "acceptance rate" and "served, greedy" in checked["legend"]
    length = _panel(outputs["acceptance"], "Acceptance length")
    low, high = serve["ci95"]
    greedy = f"served by vLLM, greedy: {serve['acceptance_length']:.2f} [{low:.2f}, {high:.2f}]"
    assert greedy in length["legend"], length["legend"]
    assert "served by vLLM, generation's sampling: 2.20 [2.05, 2.35]" in length["legend"]
    sources = _panel(outputs["acceptance"], "Served acceptance length by source")
    assert sources["texts"] == [f"{v['acceptance_length']:.2f}" for v in serve["by_source"].values()]
    baseline = json.loads(Path(inputs["baseline_serve_check"]).read_text())
    versus = _panel(outputs["comparison"], "Acceptance length on the target's own outputs")
    assert f"target's own traces, served: {serve['acceptance_length']:.2f}" in versus["legend"]
    assert f"dataset answers (baseline), served: {baseline['acceptance_length']:.2f}" in versus["legend"]


def test_baseline_rows_answer_with_the_original_and_rebuild_ids():
    train = pl.DataFrame(
        {
            "id": ["a", "b", "c"],
            "shard": [0, 0, 1],
            "question": ["q1", "q2", "q3"],
            "reasoning": ["r", "r", "r"],
            "content": ["c", "c", "c"],
            "original_answer": ["orig", None, "  "],
            "prompt_token_ids": [[1, 2], [3], [4]],
            "completion_token_ids": [[5], [6], [7]],
        },
        schema_overrides={"prompt_token_ids": pl.List(pl.Int32), "completion_token_ids": pl.List(pl.Int32)},
    )
    out = baseline_frame(train)
    assert out["id"].to_list() == ["a"]  # no original answer: dropped
    row = out.row(0, named=True)
    assert (row["content"], row["reasoning"], row["prompt_token_ids"], row["completion_token_ids"]) == (
        "orig",
        "",
        None,
        None,
    )
    assert out.schema["prompt_token_ids"] == pl.List(pl.Int32)


def test_baseline_without_answers_is_refused(tmp_path):
    path = tmp_path / "train.parquet"
    pl.DataFrame(
        {"id": ["a"], "original_answer": [None]}, schema={"id": pl.String, "original_answer": pl.String}
    ).write_parquet(path)
    # a shard without answers adds nothing (an empty file); a dataset without the column is refused
    assert write_baseline_traces(path, tmp_path / "out.parquet") == 0
    assert pl.read_parquet(tmp_path / "out.parquet").height == 0
    with pytest.raises(BaselineError, match="no original_answer column"):
        baseline_frame(pl.DataFrame({"id": ["a"]}))


def test_slices_are_drawn_in_context_order_then_thinking_before_answer():
    # offline.json's keys come sorted as text ("context 128-192" before "context 64-128")
    from eagle3_pipeline.validate.report import _slice_order

    names = ["answer", "context 0-64", "context 128-192", "context 192+", "context 64-128", "thinking"]
    contexts = sorted((n for n in names if n.startswith("context")), key=_slice_order)
    assert contexts == ["context 0-64", "context 64-128", "context 128-192", "context 192+"]
    assert sorted(["answer", "thinking"], key=_slice_order) == ["thinking", "answer"]
