"""Snapshot cost: parsing the unit corpus in memory beside the full local snapshot (files read, the
model folder fingerprinted and vLLM's version read through subprocesses) and, with --ssh DEST, over SSH.

Prints one JSON line per measurement. Examples:
    .venv/bin/python benchmarks/server.py
    .venv/bin/python benchmarks/server.py --unit-file resources/demo/vllm-demo.service
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from eagle3_pipeline.server.remote import LocalHost, open_host
from eagle3_pipeline.server.snapshot import parse_service, take_snapshot
from eagle3_pipeline.settings import ServerSettings

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "data" / "units"


def corpus_texts(folder: Path) -> list[tuple[str, str]]:
    """(unit name, unit text) of each corpus case whose unit is self-contained (no @DIR@ files)."""
    cases = []
    for case in sorted(p for p in CORPUS.iterdir() if p.is_dir()):
        path = next(case.glob("*.service"), case / "cat.txt")
        text = path.read_text().replace("@DIR@", str(folder))
        name = path.name if path.suffix == ".service" else Path(text.splitlines()[0][2:]).name
        cases.append((name, text))
    return cases


def bench_parse(repeats: int) -> dict:
    host = LocalHost()
    with tempfile.TemporaryDirectory() as tmp:
        cases = corpus_texts(Path(tmp))
        start = time.perf_counter()
        for _ in range(repeats):
            for name, text in cases:
                parse_service(text, name, host)
        seconds = time.perf_counter() - start
    return {
        "figure": "parse_unit",
        "units": len(cases) * repeats,
        "ms_per_unit": 1000 * seconds / (len(cases) * repeats),
    }


def bench_snapshot(server: ServerSettings, repeats: int, label: str) -> dict:
    host = open_host(server)
    times = []
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            take_snapshot(server, host)
            times.append(time.perf_counter() - start)
    finally:
        host.close()
    return {
        "figure": f"snapshot_{label}",
        "repeats": repeats,
        "ms_median": 1000 * sorted(times)[len(times) // 2],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unit-file", default=str(CORPUS / "01_vllm_serve_basic" / "vllm.service"))
    parser.add_argument("--ssh", help="an SSH destination whose systemd unit --unit is snapshotted")
    parser.add_argument("--unit", default="vllm.service")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    parse = bench_parse(args.repeats * 10)
    sys.stdout.write(json.dumps(parse) + "\n")
    unit_file = Path(args.unit_file)
    local = bench_snapshot(
        ServerSettings(host="local", unit=unit_file.name, unit_file=str(unit_file)), args.repeats, "local"
    )
    local["ratio_to_parse"] = local["ms_median"] / parse["ms_per_unit"]
    sys.stdout.write(json.dumps(local) + "\n")
    if args.ssh:
        ssh = bench_snapshot(ServerSettings(host=args.ssh, unit=args.unit), args.repeats, "ssh")
        ssh["ratio_to_local"] = ssh["ms_median"] / local["ms_median"]
        sys.stdout.write(json.dumps(ssh) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
