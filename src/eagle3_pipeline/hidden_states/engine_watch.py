"""An extraction job ends with its engine job: no client of a failed group is left running.

When one job of a group fails, Snakemake kills the group's `shell:` jobs (the engine job, whose worker
dies with it) but lets its `script:` jobs run on (Snakemake 9.27.1, executors/local.py
run_group_job), and the extraction jobs are script jobs: one waiting to join or planning would wait
for an engine that never comes, one packing would finish after Snakemake removed the group's outputs.
The engine job writes its process into its service() output as it starts (engine.serve: `job_pid`,
`host`); Snakemake ends it only after every client is done, so a client that finds it gone while it
still runs belongs to a failed group and exits at once (on SLURM the group's jobs share one node, so
the pid is this host's). Its parts and packed file stay in its work folder: the rerun resumes there.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from eagle3_pipeline.server.process_identity import pid_alive

log = logging.getLogger(__name__)
WATCH_S = 1.0  # how often a client looks at its engine job
ENGINE_JOB_GONE = 75  # the exit status of a client whose engine job is gone (EX_TEMPFAIL: rerun it)


def engine_job(service: Path) -> dict[str, Any] | None:
    """The engine job's record in its service() output: {job_pid, host, ...}, or None before it wrote it
    (Snakemake removes the file before the group starts, and the job's shell makes it empty)."""
    try:
        record = json.loads(Path(service).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("job_pid") else None


def engine_job_gone(service: Path) -> bool:
    """The engine job that wrote `service` ran on this host and its process is gone."""
    record = engine_job(service)
    if record is None or record.get("host") != socket.gethostname():
        return False
    return not pid_alive(int(record["job_pid"]))


def _exit_when_gone(service: Path) -> None:
    while not engine_job_gone(service):
        time.sleep(WATCH_S)
    log.error("the extraction engine job (%s) is gone: its group failed; this job ends too", service)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(ENGINE_JOB_GONE)  # from a thread: the whole process, wherever its main thread is


def watch(service: Path) -> threading.Thread:
    """End this process once the engine job of `service` is gone (a daemon thread)."""
    thread = threading.Thread(target=_exit_when_gone, args=(Path(service),), daemon=True, name="engine-watch")
    thread.start()
    return thread
