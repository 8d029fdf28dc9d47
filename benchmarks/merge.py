"""Benchmark of rule merge_traces: streaming merge vs reading every shard into memory at once.

    .venv/bin/python benchmarks/merge.py [--shards 1000] [--rows 1000] [--dir /tmp/merge-bench]

Writes synthetic generation shards (tests/support/traces.py: the generator's exact schema, 16-64
token ids per list), then runs each method in a fresh subprocess and reads that child's own peak
RSS from os.wait4, so one method's memory never hides another's. Prints JSON lines: the data
set, one line per method, and the ratios side by side.

Methods:
  merge_tenth  merge_traces on the first 10% of the shards: peak memory should not grow 10x with the
               corpus (it is bounded by chunks, not rows).
  merge        eagle3_pipeline.traces.merge_traces: every output (traces, conversations.jsonl,
               stats.json, plots), streaming.
  split_tenth  split_traces (rule split_traces) on merge_tenth's traces.parquet.
  split        split_traces on merge's traces.parquet -> train.parquet, validation.parquet: peak
               memory should not grow 10x over split_tenth either.
  read_all     pl.read_parquet of every shard + pl.concat: the floor of any in-memory approach.
  eager_merge  read_all, then filter ok rows, split and write traces/train/validation eagerly: the
               in-memory way to the main outputs (no checks, no dedup, no stats).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

import polars as pl  # noqa: E402

from eagle3_pipeline.settings import TracesSettings  # noqa: E402
from eagle3_pipeline.traces import (  # noqa: E402
    TraceOutputs,
    merge_traces,
    split_of,
    split_traces,
)

# the schema's filters with no failed-row limit: a benchmark times the merge, it checks nothing
LIMITLESS = TracesSettings(max_failed_fraction=1.0)
METHODS = ("merge_tenth", "merge", "split_tenth", "split", "read_all", "eager_merge")


def _shards(directory: Path, kind: str = "generations") -> list[Path]:
    return sorted((directory / kind).glob("shard-*.parquet"))


def _write_prompts(directory: Path) -> None:
    """prompts/shard-k.parquet with the ids of generation shard k (merge_traces checks them)."""
    (directory / "prompts").mkdir(exist_ok=True)
    for path in _shards(directory):
        pl.read_parquet(path, columns=["id", "source", "question"]).write_parquet(
            directory / "prompts" / path.name
        )


def prepare(directory: Path, shards: int, rows: int) -> dict:
    """Write the synthetic shards once (reused while shard and row counts match)."""
    from support.traces import write_generation_shards, write_identity

    marker = directory / "dataset.json"
    wanted = {"shards": shards, "rows_per_shard": rows}
    if not (marker.exists() and json.loads(marker.read_text()) == wanted):
        start = time.perf_counter()
        write_generation_shards(directory / "generations", shards, rows)
        write_identity(directory / "identity.json")
        _write_prompts(directory)
        marker.write_text(json.dumps(wanted))
        wanted["write_s"] = round(time.perf_counter() - start, 1)
    paths = _shards(directory)
    lengths = (
        pl.scan_parquet(paths[:10]).select(pl.col("prompt_token_ids").list.len().mean()).collect().item()
    )
    return {
        "dataset": "synthetic generations",
        **wanted,
        "rows": shards * rows,
        "bytes_on_disk": sum(p.stat().st_size for p in paths),
        "mean_prompt_token_ids": round(lengths, 1),
    }


def run_method(method: str, directory: Path) -> dict:
    """The work of one method, in this (child) process; returns figures about its output."""
    paths = _shards(directory)
    out = directory / f"out-{method}"
    if method.startswith("split"):
        merged = directory / f"out-{method.replace('split', 'merge')}"  # written by that method's run
        traces = TraceOutputs.in_dir(merged).traces
        if not traces.exists():
            raise SystemExit(f"{traces} is missing: run the merge method of the same size first")
        return split_traces(traces, out / "train.parquet", out / "validation.parquet")
    if method.startswith("merge"):
        if method == "merge_tenth":
            paths = paths[: max(1, len(paths) // 10)]
        prompts = [directory / "prompts" / p.name for p in paths]
        outputs = TraceOutputs.in_dir(out)
        stats = merge_traces(paths, directory / "identity.json", outputs, LIMITLESS, prompts=prompts)
        sizes = {p.name: p.stat().st_size for p in (outputs.traces, outputs.conversations)}
        return {
            "prompts": stats["prompts"],
            "kept": stats["kept"],
            "validation": stats["validation"],
            "bytes": sizes,
        }
    frame = pl.concat([pl.read_parquet(p) for p in paths])
    if method == "read_all":
        return {"rows": frame.height}
    split = pl.col("id").map_elements(lambda i: split_of(i, 0.05), return_dtype=pl.String)
    kept = frame.filter(pl.col("status") == "ok").with_columns(split=split)
    out.mkdir(parents=True, exist_ok=True)
    kept.write_parquet(out / "traces.parquet")
    for name in ("train", "validation"):
        kept.filter(pl.col("split") == name).write_parquet(out / f"{name}.parquet")
    return {"kept": kept.height}


def measure(method: str, directory: Path) -> dict:
    """Run `method` in a fresh interpreter; wall time and that child's peak RSS (os.wait4)."""
    command = [sys.executable, __file__, "--dir", str(directory), "--child", method]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{method} failed with status {status}")
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4: tell Popen
    return {
        "method": method,
        "wall_s": round(seconds, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        **json.loads(output),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=1000, help="rows (prompts) per shard")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/merge-bench"))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s: %(message)s")
        sys.stdout.write(json.dumps(run_method(args.child, args.dir)) + "\n")
        return
    sys.stdout.write(json.dumps(prepare(args.dir, args.shards, args.rows)) + "\n")
    results = {}
    for method in args.methods:
        results[method] = measure(method, args.dir)
        sys.stdout.write(json.dumps(results[method]) + "\n")
        sys.stdout.flush()
    if "merge" in results and len(results) > 1:
        ratios = {
            f"{m}_over_merge": {
                "wall": round(r["wall_s"] / results["merge"]["wall_s"], 2),
                "peak_rss": round(r["peak_rss_mb"] / results["merge"]["peak_rss_mb"], 2),
            }
            for m, r in results.items()
            if m != "merge"
        }
        sys.stdout.write(json.dumps({"ratios": ratios, "load_average": os.getloadavg()}) + "\n")


if __name__ == "__main__":
    main()
