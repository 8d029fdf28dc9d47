"""fixes: the one line a failed job ends with, and the failed jobs' lines found from Snakemake's log."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3_pipeline.fixes import error_line, failed_job_logs, fix_for, print_failures


class DatasetError(ValueError):
    pass


class TransportError(RuntimeError):
    pass


class Sub(DatasetError):
    pass


def test_the_fix_follows_the_errors_kind_along_its_mro():
    assert fix_for(DatasetError()).startswith("dataset.path")
    assert fix_for(Sub()).startswith("dataset.path")
    assert "server.host" in fix_for(TransportError()) and "known_hosts" in fix_for(TransportError())
    assert fix_for(KeyError("x")) is None  # a bug gets no hint rather than a wrong one


def test_the_line_names_the_rule_the_error_the_fix_and_the_log():
    line = error_line("prepare_prompts", DatasetError(), "bad rows\nmore", "logs/p.log")
    assert line == (
        "ERROR: prepare_prompts failed: DatasetError: bad rows (fix: dataset.path (the file, its format: "
        ".jsonl, .json, .parquet, a folder or hf://); log: logs/p.log)"
    )
    assert error_line("x", KeyError(), "k", None) == "ERROR: x failed: KeyError: k"


def test_onerror_prints_each_failed_jobs_last_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    job_log = tmp_path / "job.log"
    job_log.write_text("ERROR: old\ntraceback\nERROR: job failed: DatasetError: x (fix: dataset.path)\n")
    main = tmp_path / "snakemake.log"
    main.write_text(
        f"Error in rule job:\n    jobid: 1\n    log: {job_log} (check log file(s))\nShutting down\n"
    )
    assert failed_job_logs(main.read_text()) == [job_log]
    print_failures([str(main)])
    assert (
        capsys.readouterr().err == "\nWhat to fix:\nERROR: job failed: DatasetError: x (fix: dataset.path)\n"
    )
    print_failures([str(tmp_path / "missing.log")])  # nothing to say, no error of its own
    assert capsys.readouterr().err == ""
