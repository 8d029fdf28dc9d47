"""hidden_states.engine_watch: a client of an engine job exits once that job's process is gone (its
group failed), and not before: real processes stand for the engine job and its client."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

from eagle3_pipeline.hidden_states import engine_watch

CLIENT = (
    "import sys, time; from eagle3_pipeline.hidden_states import engine_watch\n"
    "engine_watch.watch(sys.argv[1]); time.sleep(60)"
)


def test_a_client_ends_once_its_engine_job_is_gone(tmp_path):
    service = tmp_path / "service.json"
    service.write_text("")  # as the job's shell leaves it before the engine job writes its record
    engine_job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(service)])
    try:
        time.sleep(3 * engine_watch.WATCH_S)
        assert client.poll() is None  # no record yet: waiting, not ending
        service.write_text(json.dumps({"job_pid": engine_job.pid, "host": socket.gethostname()}))
        time.sleep(3 * engine_watch.WATCH_S)
        assert client.poll() is None  # its engine job runs
        engine_job.kill()  # Snakemake kills a failed group's shell jobs
        engine_job.wait()
        assert client.wait(timeout=30) == engine_watch.ENGINE_JOB_GONE
    finally:
        for process in (engine_job, client):
            if process.poll() is None:
                process.kill()


def test_an_engine_job_of_another_host_is_never_taken_for_gone(tmp_path):
    service = tmp_path / "service.json"
    service.write_text(json.dumps({"job_pid": 2**22 + 7, "host": "another-node"}))
    assert not engine_watch.engine_job_gone(service)
    service.write_text(json.dumps({"job_pid": 2**22 + 7, "host": socket.gethostname()}))
    assert engine_watch.engine_job_gone(service)
