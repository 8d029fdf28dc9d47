"""What hidden_states.max_disk_gb costs on the demo pieces: the same small run capped and uncapped.

Each case runs the whole workflow (tiny target built by the rule, real vLLM CPU server, extraction,
training, export, offline validation) in a scratch folder, while a thread polls the bytes under
results/{run}/hidden_states and the extraction's work folders every 5 ms. Printed per case, one JSON
line: the cap, the corpus's states (from the first epoch's metadata), the high-water mark, the
extraction and training jobs run, and the wall and CPU seconds of the run.

    .venv/bin/python benchmarks/disk_cap.py [--samples 24] [--epochs 2] [--cases uncapped capped]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from eagle3_pipeline.state_bytes import GB, bytes_per_token

REPO = Path(__file__).resolve().parents[1]
SHARD_SIZE, MAX_SEQ_LEN, HIDDEN = 4, 96, 128  # the demo target's hidden size


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _size(folders: list[Path]) -> int:
    total = 0
    for folder in folders:
        for root, _, files in os.walk(folder):
            for name in files:
                with contextlib.suppress(FileNotFoundError):
                    total += os.stat(os.path.join(root, name)).st_size
    return total


def run_case(name: str, samples: int, epochs: int, cap_gb: float | None) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix=f"disk-cap-{name}-"))
    (workdir / "config").symlink_to(REPO / "config")
    config = {
        "run": name,
        "demo": {"port": _free_port(), "fit_seconds": 20},
        "dataset": {"num_samples": samples, "shard_size": SHARD_SIZE},
        "generation": {"max_tokens": 64},
        "traces": {"validation_fraction": 0.5},
        "hidden_states": {"max_seq_len": MAX_SEQ_LEN, "batch_tokens": 1024, "max_disk_gb": cap_gb},
        "train": {"epochs": epochs, "batch_tokens": 256},
        "validate": {"serve_check": False, "baseline": False},
    }
    (workdir / "c.yaml").write_text(yaml.safe_dump(config))
    results = workdir / "results" / name
    folders = [results / "hidden_states", results / "work" / "hidden_states"]
    peak, done = [0], threading.Event()

    def poll() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _size(folders))
            time.sleep(0.005)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]
    command += ["--directory", str(workdir), "--configfile", "c.yaml", "--cores", "2"]
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True, check=False)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    done.set()
    watcher.join()
    first = results / "hidden_states" / ("epoch-0" if cap_gb else "")
    metadata = sorted(first.glob("*/shard-*.json"))
    tokens = sum(json.loads(p.read_text())["num_tokens"] for p in metadata)
    logs = results / "logs"
    return {
        "case": name,
        "ok": result.returncode == 0,
        "cap_bytes": None if cap_gb is None else round(cap_gb * GB),
        "corpus_state_bytes": tokens * bytes_per_token(HIDDEN),
        "high_water_bytes": peak[0],
        "extraction_jobs": len(list((logs / "extract_hidden_states").rglob("*.log"))),
        "training_jobs": len(list(logs.glob("train_draft.log")))
        + len(list((logs / "train_draft_window").rglob("*.log"))),
        "wall_s": round(wall, 1),
        "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
        "workdir": str(workdir),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--cases", nargs="+", default=["uncapped", "capped"])
    args = parser.parse_args()
    cap_gb = 4 * SHARD_SIZE * MAX_SEQ_LEN * bytes_per_token(HIDDEN) / GB  # windows of 2 shards
    for case in args.cases:
        record = run_case(case, args.samples, args.epochs, cap_gb if case == "capped" else None)
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
