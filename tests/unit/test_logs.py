"""The job log a script writes through logs.setup_logging: no secret the job knows reaches it, by any of
the ways a job writes (logging, warnings, print to stdout or stderr, a write in pieces, an uncaught
error), and none reaches the console either; what surrounds a secret is kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SECRET = "tok-9f3b2c7d41e8a6"  # known to the job by fingerprint only, as server.json hands it over
JOB = f"""
import sys, warnings, logging
from eagle3_pipeline.secrets import REDACTOR, Redactor
from eagle3_pipeline.logs import setup_logging

known = Redactor("salt")
known.add({SECRET!r})
REDACTOR.learn(known.export())  # what secrets.learn(server_json) does
log = setup_logging(sys.argv[1], "job")
log.info("logged %s", {SECRET!r})
warnings.warn("warned {SECRET}")
print("printed", {SECRET!r})
print("to stderr", {SECRET!r}, file=sys.stderr)
sys.stderr.write("in pieces tok-9f3b")
sys.stderr.write("2c7d41e8a6 done\\n")
sys.stderr.write("a partial line {SECRET}")
sys.stderr.flush()
raise RuntimeError("failed with {SECRET}")
"""


def test_a_job_leaves_no_secret_in_its_log_or_on_the_console(tmp_path: Path):
    log = tmp_path / "job.log"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    done = subprocess.run(
        [sys.executable, "-c", JOB, str(log)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 1  # the uncaught error still fails the job
    text = log.read_text()
    for marker in ("logged", "warned", "to stderr", "in pieces", "done", "a partial line", "RuntimeError"):
        assert marker in text, f"{marker!r} missing from the log:\n{text}"
    assert SECRET not in text, text
    assert "printed <redacted>" in done.stdout and SECRET not in done.stdout + done.stderr
    assert "job failed: RuntimeError: failed with <redacted>" in done.stderr
