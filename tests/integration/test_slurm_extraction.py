"""The SLURM tier: the extraction of 4 shards (vLLM CPU engine) submitted by snakemake-executor-plugin-slurm
with profiles/slurm to a real one-node SLURM 22.05 (support.slurm), as a user runs it from a login node.

One engine scope is one allocation on one node with the engine's 8 GPUs, its CPUs and the memory of it
and of the clients that run (hidden_states/allocation.py); a client killed mid-scope
fails its group, which leaves no process on the node, and its rerun takes the finished shards back (the
same files) and extracts only the killed one, on one engine start; a single shard forced again runs
inside an engine scope, with the GPUs. The tests run in order on one working directory.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support.hidden_states import trace_rows, write_traces
from support.slurm import Cluster
from support.vllm_server import cpu_vllm_env
from support.workflow import merge

from eagle3_pipeline.config import check_config
from eagle3_pipeline.hidden_states.allocation import packing_bytes
from eagle3_pipeline.settings import build_settings

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "config" / "schema.yaml"
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
SPLITS = ("train", "validation")
SHARDS = ("00000", "00001", "00002", "00003")
LONG_SHARD = "00003"  # the one killed mid-scope: many small batches, the others done well before it
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.slurm]


def _inputs(workdir: Path, tokenizer) -> Path:
    """4 shards' traces, the server's snapshot and stop report, the config: what the extraction rules
    and their engine job read. Returns results/t."""
    results = workdir / "results" / "t"
    for k, shard in enumerate(SHARDS):
        samples = 120 if shard == LONG_SHARD else 3
        for split, rows in (("train", samples), ("validation", 1)):
            folder = results / "traces" / "shards" / split
            folder.mkdir(parents=True, exist_ok=True)
            start = 1000 * k + (0 if split == "train" else samples)
            write_traces(folder / f"shard-{shard}.parquet", trace_rows(tokenizer, rows, shard=k, start=start))
    (results / "server").mkdir()
    snapshot = {
        "python": str(VLLM_PYTHON),
        "tensor_parallel_size": 1,
        "max_model_len": 512,
        "trust_remote_code": False,
        "args": {"--dtype": "bfloat16", "--enforce-eager": True},
        "env": {k: v for k, v in cpu_vllm_env().items() if k.startswith("VLLM_")},
    }
    (results / "server" / "server.json").write_text(json.dumps(snapshot))
    (results / "server" / "stopped.json").write_text("{}\n")  # after it: the stop is not stale
    (workdir / "config").symlink_to(REPO / "config")
    return results


def _config(workdir: Path, target: Path) -> None:
    hidden_states = {"backend": "vllm", "max_seq_len": 400, "batch_tokens": 64, "vllm": {"max_clients": 2}}
    config = {"run": "t", "demo": {"enabled": False}, "target": {"model": str(target)}}
    (workdir / "c.yaml").write_text(yaml.safe_dump(config | {"hidden_states": hidden_states}))


def _targets() -> list[str]:
    return [f"results/t/hidden_states/{s}/shard-{k}.safetensors" for k in SHARDS for s in SPLITS]


def _command(workdir: Path, *args: str) -> list[str]:
    """snakemake on the login node with the project's SLURM profile; squeue tracks the jobs (no
    accounting here) from the first second."""
    return [
        sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(workdir),
        "--workflow-profile", str(REPO / "profiles" / "slurm"), "--configfile", "c.yaml",
        "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "1",
        "--latency-wait", "5", "--retries", "0", *_targets(),
        "--allowed-rules", "check_disk_budget", "extract_hidden_states", "serve_extraction_engine", *args,
    ]  # fmt: skip


def _env(cluster: Cluster) -> dict[str, str]:
    env = {k: v for k, v in cluster.env.items() if k not in ("VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES")}
    return env | {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin:/usr/sbin"}


def _run(workdir: Path, cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    command = _command(workdir, *args)
    return subprocess.run(
        command, cwd=workdir, env=_env(cluster), capture_output=True, text=True, timeout=900
    )


def _failure(result: subprocess.CompletedProcess[str], workdir: Path, cluster: Cluster) -> str:
    logs = "\n".join(f"== {p}\n{p.read_text()[-2500:]}" for p in sorted(workdir.rglob("*.log"))[-12:])
    return f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}\n{logs}\n{cluster.logs()}"


def _engine_starts(results: Path) -> int:
    log = results / "logs" / "extraction_engine" / "hidden_states" / "engine.log"
    return log.read_text().count(" starting ===") if log.exists() else 0


def _allocations(cluster: Cluster, known: set[str]) -> list[dict[str, str]]:
    """The jobs submitted since `known`, each as `scontrol show job` reads it (one line of key=value)."""
    new = [job["id"] for job in cluster.jobs() if job["id"] not in known]
    out = []
    for job_id in new:
        line = cluster.run("scontrol", "show", "job", "--oneliner", job_id)
        out.append(dict(re.findall(r"(\w[\w/:]*)=(\S*)", line)))
    return out


def _one_node_eight_gpus(allocation: dict[str, str], clients: int, config: Path) -> bool:
    """The engine scope's allocation: one node, the engine's 8 GPUs (--gpus=8, as scontrol lists it),
    the engine's 64 CPUs and one for each of the 4 clients that may pack at once, its memory with its
    packing clients' and 512 MiB for each client of the group (profiles/slurm, allocation.py)."""
    raw = merge(
        yaml.safe_load((REPO / "config" / "config.yaml").read_text()), yaml.safe_load(config.read_text())
    )
    settings = build_settings(check_config(raw, SCHEMA))  # as the workflow reads it: its defaults, then -c
    hidden = json.loads((Path(settings.target.model) / "config.json").read_text())["hidden_size"]
    packing = -(-packing_bytes(settings, hidden) // 2**20)
    memory = 1_000_000 + settings.hidden_states.pack_slots * packing + clients * 512
    return (
        allocation["NumNodes"] == "1"
        and "gpu:8" in allocation.get("TresPerJob", "")
        and allocation["NumCPUs"] == "68"
        and f"mem={memory}M" in allocation["TRES"]
    )


def _files(results: Path) -> dict[str, tuple[int, int]]:
    """Each state file's (inode, mtime): the same inode is the same file, not extracted again."""
    found = {}
    for path in sorted((results / "hidden_states").glob("*/shard-*.safetensors")):
        stat = path.stat()
        found[f"{path.parent.name}/{path.name}"] = (stat.st_ino, stat.st_mtime_ns)
    return found


def _client_pid(shard: str) -> int | None:
    """The extraction client of `shard` running on this node (its job file names its work folder)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        job_file = f"work/hidden_states/{shard}/job.json".encode()
        if b"eagle3_pipeline.hidden_states" in cmdline and any(job_file in arg for arg in cmdline):
            return int(proc.name)
    return None


def _pipeline_processes(workdir: Path) -> list[str]:
    """Processes of this working directory's extraction left on the node (engine, clients, vLLM)."""
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        ours = "eagle3_pipeline" in cmdline or "vllm" in cmdline or "snakemake" in cmdline
        if ours and cwd.startswith(str(workdir)):
            left.append(f"{proc.name}: {cmdline[:200]}")
    return left


@pytest.fixture(scope="module")
def scope(tmp_path_factory, hs_target, hs_tokenizer, slurm_cluster):
    workdir = tmp_path_factory.mktemp("slurm-extraction")
    results = _inputs(workdir, hs_tokenizer)
    _config(workdir, hs_target)
    return {"workdir": workdir, "results": results, "cluster": slurm_cluster, "seen": set()}


def test_a_killed_client_fails_its_group_and_leaves_no_process_on_the_node(scope):
    workdir, results, cluster = scope["workdir"], scope["results"], scope["cluster"]
    scope["seen"] = {job["id"] for job in cluster.jobs()}
    process = subprocess.Popen(
        _command(workdir), cwd=workdir, env=_env(cluster), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    finished = [f"{s}/shard-{k}.safetensors" for k in SHARDS if k != LONG_SHARD for s in SPLITS]
    try:
        deadline = time.monotonic() + 600
        while not all((results / "hidden_states" / f).exists() for f in finished):
            assert process.poll() is None, process.communicate()[0][-5000:] + cluster.logs()
            assert time.monotonic() < deadline, "the short shards never finished"
            time.sleep(0.2)
        scope["finished"] = {f: v for f, v in _files(results).items() if f in finished}
        pid = _client_pid(LONG_SHARD)
        assert (
            pid is not None
            and not (results / "hidden_states" / "train" / f"shard-{LONG_SHARD}.json").exists()
        )
        os.kill(pid, signal.SIGKILL)  # mid-scope: its batches not all done
        output = process.communicate(timeout=600)[0]
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0, output[-4000:]
    (allocation,) = _allocations(cluster, scope["seen"])  # the whole scope: one sbatch
    assert _one_node_eight_gpus(allocation, len(SHARDS), workdir / "c.yaml"), allocation
    # Snakemake removed every output of the failed group; the finished shards wait in the engine's folder
    kept = results / "work" / "hidden_states" / "engine" / "kept"
    assert len(list(kept.glob("*.safetensors"))) == len(finished), list(kept.iterdir())
    deadline = time.monotonic() + 60
    while _pipeline_processes(workdir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _pipeline_processes(workdir) == []  # the engine, every client, vLLM: gone with the group
    scope["seen"] = {job["id"] for job in cluster.jobs()}


def test_the_rerun_extracts_only_the_killed_shard_on_one_engine_start(scope):
    workdir, results, cluster = scope["workdir"], scope["results"], scope["cluster"]
    starts = _engine_starts(results)
    done = _run(workdir, cluster)
    assert done.returncode == 0, _failure(done, workdir, cluster)
    (allocation,) = _allocations(cluster, scope["seen"])
    assert _one_node_eight_gpus(allocation, len(SHARDS), workdir / "c.yaml"), allocation
    assert _engine_starts(results) == starts + 1
    files = _files(results)
    # the same files, their bytes never rewritten (Snakemake touches an output older than its job's start)
    assert all(files[f][0] == before[0] for f, before in scope["finished"].items()), (
        files,
        scope["finished"],
    )
    assert len(files) == len(SHARDS) * len(SPLITS)
    for shard in SHARDS:
        log = (results / "logs" / "extract_hidden_states" / f"{shard}.log").read_text()
        restored = "taken back from" in log
        assert restored == (shard != LONG_SHARD), log[-3000:]
    assert not (results / "work" / "hidden_states" / "engine" / "kept").exists()  # released: all done
    scope["seen"] = {job["id"] for job in cluster.jobs()}


def test_a_single_shard_forced_again_runs_inside_an_engine_scope_with_the_gpus(scope):
    workdir, results, cluster = scope["workdir"], scope["results"], scope["cluster"]
    before, starts = _files(results), _engine_starts(results)
    forced = "results/t/hidden_states/train/shard-00001.safetensors"
    done = _run(workdir, cluster, "--forcerun", forced)
    assert done.returncode == 0, _failure(done, workdir, cluster)
    (allocation,) = _allocations(cluster, scope["seen"])
    assert _one_node_eight_gpus(allocation, 1, workdir / "c.yaml"), allocation  # the forced shard's client
    assert _engine_starts(results) == starts + 1
    log = (results / "logs" / "extract_hidden_states" / "00001.log").read_text()
    assert "joined the extraction engine " in log and " started (pid " not in log, log[-3000:]
    after = _files(results)
    changed = sorted(f for f in after if after[f] != before[f])
    assert changed == [
        "train/shard-00001.safetensors",
        "validation/shard-00001.safetensors",
    ]  # its job: both splits
