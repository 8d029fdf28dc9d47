"""Your own data beside the demo (issue 40, item 5): `dataset.path` with the demo config and a `run` of
its own plans no refit of the demo target (resources/demo/, fitted on the bundled sample whatever
dataset.path is) and nothing under results/demo/; every job writes under results/{run}/. Dry runs only.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from support.workflow import REPO, job_counts, workdir_run, write_config

TARGET_FILES = ("config.json", "tokenizer.json")


def built_demo_target(workdir: Path) -> None:
    """resources/demo/ as `make demo` leaves it (the shipped test target's small files, placeholder
    weights: a dry run reads no weights), newer than the bundled sample and the unit template."""
    target = workdir / "resources" / "demo" / "target"
    target.mkdir(parents=True)
    for name in TARGET_FILES:
        shutil.copyfile(REPO / "tests" / "data" / "demo-target" / "target" / name, target / name)
    (target / "model.safetensors").write_bytes(b"")
    (workdir / "resources" / "demo" / "vllm-demo.service").write_text("[Service]\nExecStart=/bin/true\n")
    later = time.time() + 5
    for path in [*target.iterdir(), workdir / "resources" / "demo" / "vllm-demo.service"]:
        os.utime(path, (later, later))


def own_dataset(path: Path) -> Path:
    """A dataset of the user's, in open-perfectblend's format, written after the demo target."""
    rows = [
        {
            "conversations": [
                {"from": "human", "value": f"What is {i} + {i}?"},
                {"from": "gpt", "value": str(2 * i)},
            ]
        }
        for i in range(40)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    later = time.time() + 10
    os.utime(path, (later, later))
    return path


def test_a_run_on_your_own_data_keeps_the_demo_target_and_results(tmp_path):
    (tmp_path / "config").symlink_to(REPO / "config")
    built_demo_target(tmp_path)
    dataset = own_dataset(tmp_path / "mine.jsonl")
    # the demo config with a run and a dataset of the user's (README: "Your own data beside the demo")
    config = write_config(
        tmp_path / "mine.yaml", run="mine", dataset={"path": str(dataset), "num_samples": 40}
    )
    result = workdir_run(tmp_path, "-n", "--configfile", str(config))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    counts = job_counts(result.stdout)
    assert "build_demo_target" not in counts, "the demo target would be refitted on the user's data"
    assert counts["prepare_prompts"] >= 1 and counts["serve_check"] >= 1
    assert "results/mine/" in result.stdout and "results/demo/" not in result.stdout


def test_your_own_data_under_run_demo_is_refused_naming_run(tmp_path):
    (tmp_path / "config").symlink_to(REPO / "config")
    dataset = own_dataset(tmp_path / "mine.jsonl")
    config = write_config(tmp_path / "mine.yaml", dataset={"path": str(dataset)})  # run: demo
    result = workdir_run(tmp_path, "-n", "--configfile", str(config))
    assert result.returncode != 0
    text = result.stdout + result.stderr
    assert "run is 'demo' but dataset.path is" in text and "set run to a name of your own" in text
