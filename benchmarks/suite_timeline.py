"""Where a test run's time went, from its TEST_TIMELINE file (tests/support/timeline.py).

    TEST_TIMELINE=/tmp/timeline.jsonl make test
    python benchmarks/suite_timeline.py /tmp/timeline.jsonl

Prints, per xdist worker, its busy seconds and when it finished (the run's end is the last worker's),
then the units of work (tests/conftest.py's scheduling scopes: a shared setup's group, else a module)
by seconds, with the worker that ran each and when it started: which unit bounds the run, and how much
of the total work each one is.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import unit_of_work  # noqa: E402  (the suite's own scheduling scopes)


def _line(text: str) -> None:
    sys.stdout.write(text + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("timeline", type=Path)
    parser.add_argument("--top", type=int, default=40, help="units of work listed")
    args = parser.parse_args(argv)
    records = [json.loads(line) for line in args.timeline.read_text().splitlines() if line.strip()]
    if not records:
        parser.error(f"{args.timeline} holds no test phases: was TEST_TIMELINE set for the run?")
    t0 = min(r["start"] for r in records)
    workers: dict[str, dict[str, float]] = defaultdict(lambda: {"busy": 0.0, "end": 0.0})
    units: dict[str, dict] = {}
    for r in records:
        seconds = r["stop"] - r["start"]
        worker = workers[r["worker"]]
        worker["busy"] += seconds
        worker["end"] = max(worker["end"], r["stop"] - t0)
        unit = units.setdefault(
            unit_of_work(r["nodeid"]), {"seconds": 0.0, "start": r["start"] - t0, "worker": r["worker"]}
        )
        unit["seconds"] += seconds
        unit["start"] = min(unit["start"], r["start"] - t0)
    total = sum(u["seconds"] for u in units.values())
    end = max(w["end"] for w in workers.values())
    _line(f"tests' time: {total / 60:.1f} worker-minutes; run: {end / 60:.1f} min")
    for name, worker in sorted(workers.items()):
        _line(f"  {name}: busy {worker['busy'] / 60:.1f} min, done at {worker['end'] / 60:.1f} min")
    _line(f"{'seconds':>8} {'share':>6} {'start':>6}  worker  unit of work")
    for name, unit in sorted(units.items(), key=lambda item: -item[1]["seconds"])[: args.top]:
        _line(
            f"{unit['seconds']:8.0f} {unit['seconds'] / total:6.1%} {unit['start'] / 60:5.1f}m  "
            f"{unit['worker']:>6}  {name}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
