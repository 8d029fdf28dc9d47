"""The demo target's fit on 1 or 2 OpenMP threads, on an idle machine and beside one busy core.

The busy core stands for the other pytest-xdist worker of `make test` (or any job beside the fit): two
OpenMP threads then wait at every barrier for a partner that is descheduled. The same step count in
each case (FitOptions.steps), so the losses must agree; wall and CPU seconds side by side, one JSON
line per case.

    .venv/bin/python benchmarks/demo_fit_threads.py [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _spin(stop) -> None:
    while not stop.is_set():
        sum(range(10_000))


def fit_case(threads: int, busy: bool, steps: int) -> dict:
    from eagle3_pipeline.demo import fit as fitting
    from eagle3_pipeline.demo.target import build_target
    from eagle3_pipeline.settings import DemoSettings

    rows = [json.loads(line) for line in (REPO / "config/demo/sample.jsonl").read_text().splitlines()]
    fitting._threads = lambda wanted: wanted  # the case's thread count whatever the load average says
    stop = multiprocessing.Event()
    spinner = multiprocessing.Process(target=_spin, args=(stop,)) if busy else None
    if spinner:
        spinner.start()
    try:
        with tempfile.TemporaryDirectory() as out:
            figures = build_target(
                rows, Path(out), DemoSettings(), fitting.FitOptions(steps=steps, threads=threads)
            )
    finally:
        stop.set()
        if spinner:
            spinner.join()
    return {"threads": threads, "other_core": "busy" if busy else "idle", **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    steps = parser.parse_args().steps
    for busy in (False, True):
        for threads in (1, 2):
            sys.stdout.write(json.dumps(fit_case(threads, busy, steps)) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
