"""`snakemake --report` builds from a tiny finished results tree: rule plot_validation draws every
picture (its upstream rules held back with --allowed-rules, so the finished files count as sources) and
the HTML report holds them with their captions."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from support.validate_results import write_finished_results
from support.workflow import workdir_run

ROOT = Path(__file__).resolve().parents[2]
TARGET = "results/report/report/acceptance.png"


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return workdir_run(workdir, "--allowed-rules", "plot_validation", *args, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("baseline", [True, False])
def test_report_builds_from_finished_results(tmp_path, baseline):
    (tmp_path / "config").symlink_to(ROOT / "config")
    (tmp_path / "report.yaml").write_text(
        yaml.safe_dump({"run": "report", "validate": {"baseline": baseline}})
    )
    write_finished_results(tmp_path / "results" / "report", baseline=baseline)

    drawn = _snakemake(tmp_path, "--configfile", "report.yaml", "--cores", "1", TARGET)
    assert drawn.returncode == 0, drawn.stderr[-4000:]
    built = _snakemake(tmp_path, "--configfile", "report.yaml", "--report", "report.html", TARGET)
    assert built.returncode == 0, built.stderr[-4000:]

    html = (tmp_path / "report.html").read_text()
    for name in (
        "server.html",
        "trace_stats.html",
        "trace_lengths.png",
        "training.png",
        "acceptance.png",
        "comparison.png",
        "selection.png",  # validate.select_every_epochs and validate.learning_curve, on in the demo
        "learning_curve.png",
        "engine.html",  # the extraction engine's starts (none recorded in this tree: the page says so)
    ):
        assert name in html, f"{name} missing from the report"
    assert "4. Validation" in html and "Published Kimi-K2.5 drafts" in html
    # the first page opens on the verdict (validate/report_front.py): what decided it, with intervals
    front = (tmp_path / "results" / "report" / "report" / "front.rst").read_text()
    assert front.startswith("Verdict: run report") and "Served check: " in front
    assert "Decided by the sampled comparison" in front and "Greedy (a diagnostic, not enforced)" in front
    assert ("Baseline (the same draft" in front) == baseline
    assert "Verdict: run report" in html and "Served check: " in html and "acceptance.png" in html
    assert '"Traces"' not in html  # one traces category ("2. Traces"), not two
