"""Planning at scale: how long `snakemake -n` takes for 10, 100, 1,000 and 10,000 shards.

Two configs, side by side for each shard count:
  demo  config/config.yaml with the baseline on, so 4 jobs per shard (prompt shard, generation,
        extraction, baseline extraction); the demo is enabled: only the dataset file is needed;
  kimi  config/examples/kimi-k2.5-8gpu.yaml (3 jobs per shard), its target folder stood in for by
        Kimi-K2.5's config.json: the SSH host, the server and the hf:// dataset are never contacted.
Each case is a temporary copy with dataset.num_samples = shards x shard_size and a run name of its own
(results/planning-*/ does not exist, so every job is planned). Parse time alone (`snakemake
--list-rules`, which builds no DAG) is printed beside the dry run, to tell the workflow's own
parse-time work from Snakemake's DAG building.

    .venv/bin/python benchmarks/planning.py [--shards 10 100 1000 10000] [--configs demo kimi]

Prints one JSON line per case: config, shards, jobs planned, parse and dry-run seconds (wall, and
CPU: the figure to compare on a shared machine), ms_per_job.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.workflow import DEMO_CONFIG, KIMI_CONFIG, KIMI_TARGET_CONFIG  # noqa: E402


def _config(folder: Path, name: str, shards: int) -> Path:
    config = yaml.safe_load((DEMO_CONFIG if name == "demo" else KIMI_CONFIG).read_text())
    config["run"] = f"planning-{name}-{shards}"
    if name == "demo":
        config["validate"]["baseline"] = True
    else:
        target = folder / "Kimi-K2.5"
        target.mkdir(exist_ok=True)
        (target / "config.json").write_text(json.dumps(KIMI_TARGET_CONFIG))
        config["target"]["model"] = str(target)
    config["dataset"]["num_samples"] = shards * config["dataset"]["shard_size"]
    path = folder / f"planning-{name}-{shards}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(args: list[str], timeout: float) -> tuple[float, float, subprocess.CompletedProcess[str] | None]:
    """Wall seconds, CPU seconds (robust on a shared machine) and the result (None on timeout)."""
    start, cpu = time.perf_counter(), _children_cpu_s()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "snakemake", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return time.perf_counter() - start, _children_cpu_s() - cpu, None
    return time.perf_counter() - start, _children_cpu_s() - cpu, result


def _total_jobs(stdout: str) -> int | None:
    totals = [line.split()[1] for line in stdout.splitlines() if line.startswith("total ")]
    return int(totals[-1]) if totals else None


def measure(name: str, shards: int, folder: Path, timeout: float) -> dict[str, object]:
    """Parse time and dry-run time of one config at one shard count."""
    config = str(_config(folder, name, shards))
    parse_s, parse_cpu, _ = _timed(["--list-rules", "--configfile", config], timeout)
    dry_s, dry_cpu, result = _timed(["-n", "--quiet", "rules", "--configfile", config], timeout)
    record: dict[str, object] = {
        "config": name,
        "shards": shards,
        "parse_s": round(parse_s, 2),
        "parse_cpu_s": round(parse_cpu, 2),
        "dry_run_s": round(dry_s, 2),
        "dry_run_cpu_s": round(dry_cpu, 2),
    }
    if result is None:
        record["error"] = f"timed out after {timeout:.0f} s"
    elif result.returncode != 0:
        record["error"] = result.stderr.strip().splitlines()[-8:]
    else:
        jobs = _total_jobs(result.stdout)
        record["jobs"] = jobs
        record["ms_per_job"] = round(1000 * dry_cpu / jobs, 2) if jobs else None
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument("--configs", nargs="+", choices=["demo", "kimi"], default=["demo", "kimi"])
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per snakemake call")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for shards in args.shards:
            for name in args.configs:
                sys.stdout.write(json.dumps(measure(name, shards, Path(folder), args.timeout)) + "\n")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
