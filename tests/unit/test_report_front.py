"""validate/report_front: the report's first page says the verdict, what decided it and the intervals."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3_pipeline.validate.headline import PATHS
from eagle3_pipeline.validate.report_front import FIGURES, front_page


def run(value: float, ci: list[float]) -> dict:
    return {"acceptance_length": value, "ci95": ci, "questions": 27}


# as serve_check.json records a run's sampling (validate/serve_check.py _sampling_dict)
SAMPLING = {
    "max_tokens": 256, "temperature": 0.6, "top_p": 0.95, "seed": 0, "chat_template_kwargs": {},
    "top_k": 20, "min_p": None, "presence_penalty": 1.5, "frequency_penalty": None,
    "repetition_penalty": None, "extra_body": {"min_tokens": 4}, "model": "demo",
}  # fmt: skip


def write(root: Path, agree: bool) -> dict[str, Path]:
    check = run(2.6, [2.5, 2.7]) | {
        "num_speculative_tokens": 3,
        "sampled": run(1.9, [1.8, 2.0]),
        "sampled_comparison": {"agree": agree, "enforced": True, "reference": "sampled"},
        "offline_comparison": {"agree": False, "enforced": False, "reference": "greedy"},
        "sampling": SAMPLING | {"temperature": 0.0},
    }
    check["sampled"]["sampling"] = SAMPLING
    offline = {
        "acceptance_length": [1.8, 2.2, 2.5],
        "ci95": [[1.7, 1.9], [2.1, 2.3], [2.4, 2.6]],
        "replayed": {
            "sampled": {"acceptance_length": [1.5, 1.7, 1.91], "ci95": [[1, 2]] * 2 + [[1.81, 2.01]]}
        },
    }
    selection = {
        "chosen": {
            "epoch": 8,
            "acceptance_length": 2.54,
            "last_epoch_acceptance_length": 2.5,
            "reason": "longest",
        },
        "candidates": [{}] * 10,
        "select_every_epochs": 1,
    }
    files = {"serve_check": check, "offline": offline, "selection": selection}
    paths = {name: root / PATHS[name].replace("/", "-") for name in files}
    for name, data in files.items():
        paths[name].write_text(json.dumps(data))
    return paths


def test_the_first_page_opens_on_the_verdict_and_what_decided_it(tmp_path: Path):
    page = front_page(write(tmp_path, agree=True), "demo", {"acceptance.png"})
    assert page.startswith("Verdict: run demo\n=================\n")
    assert "**Served check: PASSED.** Decided by the sampled comparison" in page
    assert "**1.90** [1.80, 2.00] tokens per target step (27 questions, k = 3)" in page
    assert "replayed offline along the traces, **1.91** [1.81, 2.01]" in page
    assert "Greedy (a diagnostic, not enforced): served **2.60** [2.50, 2.70]" in page and "DISAGREES" in page
    assert "Epoch shipped: **9 of 10** (counted from 1), +0.040 over the last epoch" in page
    assert "Baseline: not trained" in page
    sent = 'top_p 0.95, seed 0, top_k 20, presence_penalty 1.5, extra_body {"min_tokens": 4}``'
    assert f"Sampling sent, the generation's: ``max_tokens 256, temperature 0.6, {sent}." in page
    assert f"Greedy run: ``max_tokens 256, temperature 0.0, {sent}." in page
    assert "* `acceptance.png`_ (Acceptance)" in page and "training.png" not in page  # only what is there
    assert len({name for name, _, _ in FIGURES}) == len(FIGURES)


def test_a_result_without_its_sampling_recorded_says_none(tmp_path: Path):
    paths = write(tmp_path, agree=True)
    check = json.loads(paths["serve_check"].read_text())
    del check["sampling"], check["sampled"]["sampling"]
    paths["serve_check"].write_text(json.dumps(check))
    assert "Sampling sent" not in front_page(paths, "demo", set())


def test_a_sampled_pair_that_disagrees_fails_the_page(tmp_path: Path):
    assert "**Served check: FAILED.**" in front_page(write(tmp_path, agree=False), "demo", set())
