"""server.replicas through Snakemake on real pieces: two local vLLM CPU servers (unit files on two
ports, run by the pipeline as local units) share a run's generation shards under a cap of one shard
job per server; a changed list of replicas reruns no finished shard; a replica serving another model
is refused, naming the field, before any server starts."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest
import yaml
from support.requirements import require
from support.vllm_server import demo_target_dir
from support.workflow import failure, job_counts, workdir_run

from eagle3_pipeline.demo.target import render_unit

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "config" / "demo" / "vllm-demo.service.in"
RUN = "rep"
SHARDS = 4
SHARD_SIZE = 4
TARGETS = [f"results/{RUN}/generations/shard-{k:05d}.parquet" for k in range(SHARDS)]


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))  # all bound at once: distinct ports
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _unit(workdir: Path, name: str, target: Path, port: int) -> str:
    path = workdir / f"{name}.service"
    path.write_text(render_unit(TEMPLATE.read_text(), REPO, target, port))
    return str(path)


def _config(workdir: Path, target: Path, replicas: list[dict]) -> None:
    config = {
        "run": RUN,
        "demo": {"enabled": False},
        "server": {
            "unit": "vllm-demo.service",
            "unit_file": str(workdir / "a.service"),
            "start_timeout_s": 600,
            "max_shard_jobs": 1,
            "replicas": replicas,
        },
        "dataset": {"num_samples": SHARDS * SHARD_SIZE, "shard_size": SHARD_SIZE},
        "generation": {"max_tokens": 16, "concurrency": 4, "global_concurrency": 4},
        "target": {"model": str(target)},
        "validate": {"baseline": False},
    }
    (workdir / "c.yaml").write_text(yaml.safe_dump(config))


def _replica_b(workdir: Path) -> list[dict]:
    return [{"name": "b", "unit_file": str(workdir / "b.service"), "max_shard_jobs": 1}]


def _snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = workdir_run(workdir, "--configfile", "c.yaml", *args, timeout=1500)
    if check and result.returncode != 0:
        pytest.fail(failure(result, workdir / "results" / RUN / "logs"))
    return result


def _span(log: Path) -> tuple[datetime, datetime]:
    """First and last timestamp of a shard job's log."""
    stamps = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)", log.read_text(), re.M)
    parse = lambda s: datetime.strptime(s, "%Y-%m-%d %H:%M:%S,%f")  # noqa: E731
    return parse(stamps[0]), parse(stamps[-1])


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory):
    """One run whose 4 shards two servers share (primary `main`, replica `b`), capped at one shard
    job per server, with 4 cores offered; the servers are stopped by rule stop_server."""
    require("vllm")
    workdir = tmp_path_factory.mktemp("replicas")
    (workdir / "config").symlink_to(REPO / "config")
    target = demo_target_dir()
    ports = _free_ports(3)
    _unit(workdir, "a", target, ports[0])
    _unit(workdir, "b", target, ports[1])
    _unit(workdir, "c", target, ports[2])  # a third replica, only ever planned (never started)
    _config(workdir, target, _replica_b(workdir))
    result = _snakemake(workdir, "--cores", "4", *TARGETS, f"results/{RUN}/server/stopped.json")
    return workdir, target, result


@pytest.mark.slow
@pytest.mark.vllm  # shared_run starts two real vLLM servers
def test_two_servers_share_the_shards_under_their_caps(shared_run):
    workdir, _, result = shared_run
    results = workdir / "results" / RUN
    assert "vllm_main=1" in result.stdout + result.stderr  # the caps as Snakemake's global resources
    assert "vllm_b=1" in result.stdout + result.stderr
    logs = {k: results / "logs" / "generate_shard" / f"{k:05d}.log" for k in range(SHARDS)}
    served_by = {k: re.search(r"is sent to server (\w+)", logs[k].read_text()).group(1) for k in logs}
    assert served_by == {0: "main", 1: "b", 2: "main", 3: "b"}  # k mod 2
    # each server really answered: its own vLLM log (started by the pipeline) holds the requests
    for state in (results / "work" / "server", results / "work" / "server" / "replicas" / "b"):
        requests = (state / "vllm-demo.service.log").read_text().count("POST /v1/chat/completions")
        assert requests >= 2 * SHARD_SIZE, state
    frames = [pl.read_parquet(results / "generations" / f"shard-{k:05d}.parquet") for k in range(SHARDS)]
    table = pl.concat(frames)
    assert table.height == SHARDS * SHARD_SIZE
    assert set(table["status"]) <= {"ok", "skipped"} and (table["status"] == "ok").sum() > 0
    # the primary's identity on every row, whichever replica wrote it: the output does not depend on it
    assert table["server_identity"].n_unique() == 1
    # the cap: one shard job at a time per server, although 4 cores allowed all 4 at once
    for server in ("main", "b"):
        spans = sorted(_span(logs[k]) for k in logs if served_by[k] == server)
        assert spans[0][1] <= spans[1][0], f"two shard jobs ran at once against {server}: {spans}"
    stopped = json.loads((results / "server" / "stopped.json").read_text())
    assert stopped["action"] == "stopped"
    replica = json.loads((results / "server" / "replicas" / "b" / "stopped.json").read_text())
    assert replica["action"] == "stopped"
    same = json.loads((results / "server" / "replicas" / "b" / "same_as_primary.json").read_text())
    assert same["same_as_primary"] is True


REPLICA_JOBS = {"snapshot_replica", "check_replica", "check_replicas", "preflight_replicas"}


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("change", ["removed", "another_added", "caps_changed"])
def test_a_changed_list_of_replicas_reruns_no_finished_shard(shared_run, change):
    workdir, target, _ = shared_run
    replicas = {
        "removed": [],
        "another_added": [
            {"name": "b", "unit_file": str(workdir / "b.service")},
            {"name": "c", "unit_file": str(workdir / "c.service")},
        ],  # fmt: skip
        "caps_changed": [{"name": "b", "unit_file": str(workdir / "b.service"), "max_shard_jobs": 3}],
    }[change]
    _config(workdir, target, replicas)
    try:
        # options taking several values come first: --cores ends them before the targets. (Not
        # --list-changes params: Snakemake 9.27 lists every output with recorded params, changed or not)
        plan = _snakemake(workdir, "-n", "--quiet", "rules", "--cores", "1", *TARGETS)
        params_only = _snakemake(
            workdir, "-n", "--rerun-triggers", "params", "--quiet", "rules", "--cores", "1", *TARGETS
        )
    finally:
        _config(workdir, target, _replica_b(workdir))
    planned = {} if "Nothing to be done" in plan.stdout + plan.stderr else job_counts(plan.stdout)
    assert "generate_shard" not in planned, plan.stdout
    # only the replicas' own jobs see the new list: a new one snapshotted and checked, the names checked
    changed = (
        {}
        if "Nothing to be done" in params_only.stdout + params_only.stderr
        else job_counts(params_only.stdout)
    )
    assert set(changed) <= REPLICA_JOBS, params_only.stdout


def test_a_replica_serving_another_model_is_refused_before_any_server_starts(tmp_path):
    (tmp_path / "config").symlink_to(REPO / "config")
    target = demo_target_dir()
    other = tmp_path / "other-model"
    shutil.copytree(target, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rope_theta": 1234.0}))  # another model
    port_a, port_b = _free_ports(2)
    _unit(tmp_path, "a", target, port_a)
    _unit(tmp_path, "b", other, port_b)
    _config(tmp_path, target, [{"name": "b", "unit_file": str(tmp_path / "b.service")}])
    result = _snakemake(tmp_path, "--cores", "2", *TARGETS, check=False)
    assert result.returncode != 0
    log = (tmp_path / "results" / RUN / "logs" / "check_replica" / "b.log").read_text()
    assert "replica 'b' does not serve what the primary serves (model_files:" in log
    assert "config.json" in log
    work = tmp_path / "results" / RUN / "work" / "server"
    assert not list(work.rglob("*.pid")) if work.exists() else True  # no server was started
    assert not (tmp_path / "results" / RUN / "generations").exists()
