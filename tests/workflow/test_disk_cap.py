"""Bounded disk, through Snakemake itself on the real demo pieces (the shared tiny target, the real vLLM
CPU server generating: the session's `demo_vllm_server`, which the run finds answering on its unit's
port and leaves running, so no server start of its own): with hidden_states.max_disk_gb below the
corpus's states, a whole run (windows extracted, trained on and deleted, per epoch) never holds more
than the cap, measured by a thread that polls the bytes under hidden_states/ and the extraction's work
folders; the run ends in an exported, validated draft, and a second run does nothing. The states are
extracted on the transformers backend: the accounting (bytes per token) and the DAG are the
backend's-independent parts under test, and the vLLM backend's extraction rule runs in
test_hidden_states_rule_vllm.py."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from support.workflow import failure, scratch_workdir, workdir_run

from eagle3_pipeline.budget import GB, STATE_FILES_AT_ONCE, bytes_per_token, state_file_bytes
from eagle3_pipeline.demo import DEMO_TARGET_SHAPE

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

SHARD_SIZE, SAMPLES, MAX_SEQ_LEN, EPOCHS = 4, 24, 96, 2
# one shard's bound B = 4 x 96 x 1,033 B; the cap also holds the two training state files S (budget.py):
# windows of floor((cap - 2S) / 2B) = 2 shards (1 kB over, against rounding)
STATE_BYTES = STATE_FILES_AT_ONCE * state_file_bytes({"draft": {}}, DEMO_TARGET_SHAPE)
CAP_GB = (4 * SHARD_SIZE * MAX_SEQ_LEN * bytes_per_token(128) + STATE_BYTES + 1000) / GB


class HighWater(threading.Thread):
    """The most bytes seen at once in some folders, polled every few milliseconds."""

    def __init__(self, folders: list[Path]) -> None:
        super().__init__(daemon=True)
        self.folders, self.peak, self.polls, self._done = folders, 0, 0, threading.Event()

    def _size(self) -> int:
        total = 0
        for folder in self.folders:
            for root, _, files in os.walk(folder):  # errors (a folder deleted while walked) are skipped
                for name in files:
                    with contextlib.suppress(FileNotFoundError):  # deleted while walking
                        total += os.stat(os.path.join(root, name)).st_size
        return total

    def run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, self._size())
            self.polls += 1
            time.sleep(0.005)

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.peak


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return workdir_run(workdir, "--configfile", "c.yaml", "--cores", "2", *args)


def test_a_capped_run_never_holds_more_than_the_cap(demo_vllm_server, tmp_path):
    port = demo_vllm_server.port  # the same target and unit: generation finds it up and leaves it so
    scratch_workdir(tmp_path, port)
    config = {
        "run": "cap",
        "demo": {"port": port},
        "dataset": {"num_samples": SAMPLES, "shard_size": SHARD_SIZE},
        "generation": {"max_tokens": 64},
        "hidden_states": {
            "backend": "transformers",
            "max_seq_len": MAX_SEQ_LEN,
            "batch_tokens": 1024,
            "max_disk_gb": CAP_GB,
        },
        "train": {"epochs": EPOCHS, "batch_tokens": 256},
        # offline validation reads the last window's validation states: give it some in 8 questions
        "traces": {"validation_fraction": 0.5},
        "validate": {"serve_check": False, "baseline": False, "learning_curve": []},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    results = tmp_path / "results" / "cap"
    watch = HighWater([results / "hidden_states", results / "work" / "hidden_states"])
    watch.start()
    run = _snakemake(tmp_path)
    peak = watch.stop()
    sys.stderr.write(f"high-water {peak:,} B ({watch.polls} polls), cap {CAP_GB * GB:,.0f} B\n")
    if run.returncode != 0:
        pytest.fail(f"capped run failed (high-water {peak:,} B): {failure(run, results / 'logs')}")

    # what the corpus's states take: every shard's metadata of the first epoch (the files are gone)
    metadata = sorted((results / "hidden_states" / "epoch-0").rglob("shard-*.json"))
    assert len(metadata) == 2 * SAMPLES // SHARD_SIZE
    corpus = sum(json.loads(p.read_text())["num_tokens"] * bytes_per_token(128) for p in metadata)
    cap = CAP_GB * GB - STATE_BYTES  # what the hidden states may take (the state files are not polled)
    sys.stderr.write(
        f"cap {cap:,.0f} B, corpus states {corpus:,} B, high-water {peak:,} B ({watch.polls} polls)\n"
    )
    assert corpus > cap, "the test needs a corpus larger than the cap"
    assert 0 < peak <= cap
    assert not list((results / "hidden_states").rglob("*.safetensors"))  # every window deleted
    history = json.loads((results / "draft" / "trained" / "history.json").read_text())
    assert [record["epoch"] for record in history] == list(range(EPOCHS))
    assert (results / "draft" / "checkpoint" / "config.json").exists()
    assert json.loads((results / "validation" / "offline.json").read_text())
    ownership = json.loads((results / "work" / "server" / "ownership.json").read_text())
    assert not ownership["started_by_pipeline"]  # the session's server served the generation
    again = _snakemake(tmp_path, "-n")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stdout[-2000:]
