"""Every planned job of a set of configs, as text, to compare the plan before and after a refactoring.

    PYTHONPATH=src:tests .venv/bin/python tests/support/plan_dump.py OUT.jsonl [--cases demo ...]

Each case is a real dry-run DAG (support.workflow.planned_jobs, Snakemake's own API from a scratch
working directory) of a config the tests plan with: the demo (config/config.yaml), the production
example as it is (config/examples/kimi-k2.5-8gpu.yaml, no weights here: target.hidden_size plans it),
that example on 4 shards under a 300 GB cap where its target's config.json stands, and the demo under
hidden_states.max_disk_gb (windows, one pass, a learning-curve point in the windows, the capped e2e
run's config) and with validate.learning_curve. One JSON line per job: the case, the rule, its
wildcards, input, output, log and params (params by repr; temporary folders and object addresses
written as placeholders), sorted. Two dumps of the same plan are byte-identical: `diff` them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.workflow import (
    DEMO_CONFIG,
    KIMI_CONFIG,
    KIMI_TARGET_CONFIG,
    e2e_overrides,
    planned_jobs,
    write_config,
)

NO_CURVE = {"baseline": False, "learning_curve": []}  # the baseline is refused under a cap


def _kimi_capped(folder: Path) -> Path:
    target = folder / "Kimi-K2.5"
    target.mkdir(exist_ok=True)
    (target / "config.json").write_text(json.dumps(KIMI_TARGET_CONFIG))
    return write_config(
        folder / "kimi-capped.yaml",
        KIMI_CONFIG,
        run="kimi-capped",
        target={"model": str(target)},
        dataset={"num_samples": 800},
        hidden_states={"max_disk_gb": 300},
    )


def _e2e_capped(folder: Path) -> Path:
    """The capped e2e run's config (tests/workflow/test_disk_cap.py: its CAP_GB) planned from scratch."""
    overrides = e2e_overrides(8000)
    overrides["hidden_states"] = {"backend": "transformers", "max_seq_len": 96, "batch_tokens": 1024,
                                  "max_disk_gb": 0.031605992}  # fmt: skip
    overrides["train"] |= {"batch_tokens": 256}
    overrides["validate"] |= {"serve_check": False, "baseline": False, "learning_curve": [0.3, 1.0]}
    return write_config(folder / "e2e-capped.yaml", **overrides)


def _demo_capped(folder: Path, run: str, gb: float, epochs: int, validate: dict = NO_CURVE) -> Path:
    """The demo under hidden_states.max_disk_gb `gb`, as run `run` (its config file named after it)."""
    return write_config(
        folder / f"{run}.yaml",
        run=run,
        hidden_states={"max_disk_gb": gb},
        train={"epochs": epochs},
        validate=validate,
    )


CASES: dict[str, Callable[[Path], Path]] = {
    "demo": lambda folder: DEMO_CONFIG,
    "kimi_example": lambda folder: KIMI_CONFIG,
    "kimi_capped": _kimi_capped,
    "demo_cap_windows": lambda folder: _demo_capped(folder, "windows", 0.2, 3),
    "demo_cap_one_pass": lambda folder: _demo_capped(folder, "one-pass", 1.0, 3),
    "demo_cap_curve": lambda folder: _demo_capped(
        folder, "cap-curve", 0.25, 2, {"baseline": False, "learning_curve": [0.5]}
    ),
    "demo_curve": lambda folder: write_config(
        folder / "curve.yaml",
        run="curve",
        dataset={"num_samples": 320},
        validate={"learning_curve": [0.25, 0.5, 1.0]},
    ),
    "e2e_capped": _e2e_capped,
}

_ADDRESS = re.compile(r" at 0x[0-9a-f]+")
_PLAN_FOLDER = re.compile(r"/tmp/eagle3-plan-[^/'\" ]+")


def _text(value: Any, folder: Path) -> str:
    text = _ADDRESS.sub(" at 0x?", repr(value)).replace(str(folder), "<CASES>")
    return _PLAN_FOLDER.sub("<WORKDIR>", text)


def _files(files: Any, folder: Path) -> list[str]:
    return [_text(str(f), folder) for f in files]


def job_lines(case: str, config: Path, folder: Path) -> list[str]:
    jobs, _ = planned_jobs(["--cores", "2", "--configfile", str(config)], "local")
    lines = []
    for job in jobs:
        record = {
            "case": case,
            "rule": job.rule.name,
            "wildcards": {k: str(v) for k, v in sorted(job.wildcards.items())},
            "input": _files(job.input, folder),
            "output": _files(job.output, folder),
            "log": _files(job.log, folder),
            "params": {name: _text(value, folder) for name, value in job.params.items()},
        }
        lines.append(json.dumps(record, sort_keys=True))
    return sorted(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="plan-dump-") as name:
        folder = Path(name)
        lines = [line for case in args.cases for line in job_lines(case, CASES[case](folder), folder)]
    args.output.write_text("\n".join(lines) + "\n")
    sys.stdout.write(f"{len(lines)} jobs of {len(args.cases)} cases written to {args.output}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
