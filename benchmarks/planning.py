"""Planning at scale: how long `snakemake -n` takes for 10, 100, 1,000 and 10,000 shards.

Three workflows, side by side for each shard count:
  demo  config/config.yaml with the baseline on, so 7 jobs per shard (prompt shard, generation, trace
        shard, disk check, extraction, baseline traces, baseline extraction); the demo is enabled:
        only the dataset file is needed;
  kimi  config/examples/kimi-k2.5-8gpu.yaml (prompt shard, generation, trace shard, disk check, and
        under its disk cap one extraction per epoch per shard plus the window chain), its target
        folder stood in for by Kimi-K2.5's config.json: the SSH host, the server and the hf://
        dataset are never contacted;
  floor a bare Snakefile of four chained one-line shell rules per shard and one rule gathering them:
        Snakemake's own cost per job, with nothing of this workflow in it.
Each case is a temporary copy with dataset.num_samples = shards x shard_size and a run name of its own
(results/planning-*/ does not exist, so every job is planned). Parse time alone (`snakemake
--list-rules`, which builds no DAG) is printed beside the dry run, to tell the workflow's own
parse-time work from Snakemake's DAG building. With --finished, the same dry run is timed again in a
scratch folder where every output exists (empty files, written in dependency order: the shape of a
finished run, without Snakemake's provenance records), which must say "Nothing to be done".

With --ratio, each demo or kimi case is timed against the floor at the same number of jobs (the bare
Snakefile at jobs / 4 shards, in the same run): floor_same_jobs_cpu_s and ratio_to_floor, the figure
issue 50 bounds (within 2x). With --before DIR too, the same dry run of another checkout's Snakefile
and package (say `git worktree add /tmp/before <commit>`), in the same run: before_cpu_s and its
before_ratio_to_floor.

    .venv/bin/python benchmarks/planning.py [--shards 10 100 1000 10000] [--configs demo kimi floor]
                                            [--finished] [--ratio [--before DIR]]

Prints one JSON line per case: config, shards, jobs planned, parse and dry-run seconds (wall, and
CPU: the figure to compare on a shared machine), ms_per_job, and finished_dry_run_s/_cpu_s.
"""

from __future__ import annotations

import argparse
import json
import os
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

FLOOR_SNAKEFILE = """
SHARDS = [f"{k:05d}" for k in range(config["shards"])]
rule all:
    input: expand("d/{s}.txt", s=SHARDS)
rule a:
    output: "a/{s}.txt"
    shell: "touch {output}"
rule b:
    input: "a/{s}.txt"
    output: "b/{s}.txt"
    shell: "touch {output}"
rule c:
    input: "b/{s}.txt"
    output: "c/{s}.txt"
    shell: "touch {output}"
rule d:
    input: "c/{s}.txt"
    output: "d/{s}.txt"
    shell: "touch {output}"
"""


def _floor(folder: Path, shards: int, timeout: float) -> dict[str, object]:
    """The bare workflow's dry run at the same shard count (4 jobs per shard, as the demo)."""
    workdir = Path(tempfile.mkdtemp(dir=folder))
    (workdir / "Snakefile").write_text(FLOOR_SNAKEFILE)
    (workdir / "c.yaml").write_text(yaml.safe_dump({"shards": shards}))
    seconds, cpu, result = _timed(["-n", "--quiet", "rules", "--configfile", "c.yaml"], timeout, cwd=workdir)
    jobs = _total_jobs(result.stdout) if result is not None and result.returncode == 0 else None
    record: dict[str, object] = {"config": "floor", "shards": shards, "jobs": jobs}
    record |= {"dry_run_s": round(seconds, 2), "dry_run_cpu_s": round(cpu, 2)}
    record["ms_per_job"] = round(1000 * cpu / jobs, 2) if jobs else None
    return record


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


def touch_outputs(configfile: Path) -> None:
    """Write every output of the planned DAG as an empty file, each level newer than the one before.

    Runs in the current directory (a scratch folder), through snakemake.api as the CLI would.
    """
    from snakemake.api import SnakemakeApi
    from snakemake.settings.enums import Quietness
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        workflow_api = api.workflow(
            resource_settings=ResourceSettings(cores=1),
            config_settings=ConfigSettings(configfiles=[configfile]),
            snakefile=REPO / "Snakefile",
            workdir=Path.cwd(),
        )
        workflow_api.dag(DAGSettings()).execute_workflow(executor="local", pseudo_executor="dryrun")
        stamp = time.time()
        for level in workflow_api._workflow.dag.toposorted():
            stamp += 1
            for job in level:
                for output in job.output:
                    path = Path(output)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.touch()
                    os.utime(path, (stamp, stamp))


def _finished(config: str, folder: Path, timeout: float) -> dict[str, object]:
    """The dry run of the same config once every output exists (in a scratch folder)."""
    workdir = Path(tempfile.mkdtemp(dir=folder))
    (workdir / "config").symlink_to(REPO / "config")
    subprocess.run(
        [sys.executable, __file__, "--touch-outputs", config], cwd=workdir, check=True, timeout=timeout
    )
    seconds, cpu, result = _timed(["-n", "--configfile", config], timeout, cwd=workdir)
    done = result is not None and "Nothing to be done" in result.stdout + result.stderr
    return {
        "finished_dry_run_s": round(seconds, 2),
        "finished_dry_run_cpu_s": round(cpu, 2),
        "nothing_to_do": done,
    }


def _workdir(folder: Path, tree: Path = REPO) -> Path:
    """A scratch working directory under `folder`, `tree`'s config/ linked in."""
    workdir = Path(tempfile.mkdtemp(dir=folder))
    (workdir / "config").symlink_to(tree / "config")
    return workdir


def _timed(
    args: list[str], timeout: float, cwd: Path = REPO, tree: Path = REPO
) -> tuple[float, float, subprocess.CompletedProcess[str] | None]:
    """Wall seconds, CPU seconds (robust on a shared machine) and the result (None on timeout); `tree`:
    the checkout whose workflow and package run."""
    start, cpu = time.perf_counter(), _children_cpu_s()
    if not (cwd / "Snakefile").exists():  # the repository's workflow, from a scratch folder
        args = ["--snakefile", str(tree / "Snakefile"), "--directory", str(cwd), *args]
    env = os.environ | {"PYTHONPATH": str(tree / "src")}
    try:
        result = subprocess.run(
            [sys.executable, "-m", "snakemake", *args],
            cwd=cwd,
            env=env,
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


def _ratio(
    config: str, jobs: int, dry_cpu: float, folder: Path, timeout: float, before: Path | None
) -> dict[str, object]:
    """The dry run's CPU seconds against the floor's at the same number of jobs, and the same dry run
    of the checkout `before` against it: one run, the same machine and load."""
    floor = _floor(folder, -(-jobs // 4), timeout)
    floor_cpu = float(floor["dry_run_cpu_s"])  # type: ignore[arg-type]
    record: dict[str, object] = {
        "floor_same_jobs": floor["jobs"],
        "floor_same_jobs_cpu_s": floor["dry_run_cpu_s"],
        "ratio_to_floor": round(dry_cpu / floor_cpu, 2),
    }
    if before is None:
        return record
    args = ["-n", "--quiet", "rules", "--configfile", config]
    _, before_cpu, result = _timed(args, timeout, cwd=_workdir(folder, before), tree=before)
    if result is None or result.returncode != 0:
        record["before_error"] = "timed out" if result is None else result.stderr[-2000:]
        return record
    record["before_jobs"] = _total_jobs(result.stdout)
    record["before_cpu_s"] = round(before_cpu, 2)
    record["before_ratio_to_floor"] = round(before_cpu / floor_cpu, 2)
    return record


def measure(
    name: str,
    shards: int,
    folder: Path,
    timeout: float,
    finished: bool,
    ratio: bool = False,
    before: Path | None = None,
) -> dict[str, object]:
    """Parse time and dry-run time of one config at one shard count."""
    if name == "floor":
        return _floor(folder, shards, timeout)
    config = str(_config(folder, name, shards))
    workdir = _workdir(folder)  # never the checkout: its results/ and .snakemake/ are left alone
    parse_s, parse_cpu, _ = _timed(["--list-rules", "--configfile", config], timeout, cwd=workdir)
    dry_s, dry_cpu, result = _timed(["-n", "--quiet", "rules", "--configfile", config], timeout, cwd=workdir)
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
        if finished:
            record |= _finished(config, folder, timeout)
        if ratio and jobs:
            record |= _ratio(config, jobs, dry_cpu, folder, timeout, before)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument(
        "--configs", nargs="+", choices=["demo", "kimi", "floor"], default=["demo", "kimi", "floor"]
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per snakemake call")
    parser.add_argument("--finished", action="store_true", help="also time the dry run of a finished run")
    parser.add_argument(
        "--ratio", action="store_true", help="also the floor at as many jobs (and --before's dry run)"
    )
    parser.add_argument("--before", type=Path, help="a checkout to compare with (with --ratio)")
    parser.add_argument("--touch-outputs", type=Path, help=argparse.SUPPRESS)  # the --finished helper
    args = parser.parse_args()
    if args.touch_outputs:
        touch_outputs(args.touch_outputs)
        return
    with tempfile.TemporaryDirectory() as folder:
        for shards in args.shards:
            for name in args.configs:
                record = measure(
                    name, shards, Path(folder), args.timeout, args.finished, args.ratio, args.before
                )
                sys.stdout.write(json.dumps(record) + "\n")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
