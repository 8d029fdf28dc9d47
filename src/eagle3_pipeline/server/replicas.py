"""More than one server (server.replicas): replicas of one model that share a run's generation shards.

The primary `server` is one replica (named `server.name`); each item of `server.replicas` names where
one more is (host, unit, unit_file, base_url, tunnel) and inherits every other key from `server` (API
key, timeouts, ssh, manage/stop flags, ca_bundle). Each replica is snapshotted like the primary and
compared with it (`identity_differences`): a replica that would write other traces stops the run.

Shard k goes to server k mod n (servers in config order, the primary first): a stable assignment that
needs no state. Which identical replica wrote a shard does not change the shard, so the assignment
reaches the generate_shard job only through values Snakemake does not record as rerun triggers: the
per-server resources (`resource_name`) and one `Fleet` params value (Snakemake records params of
builtin types only; tests/workflow/test_replicas.py checks that a changed fleet reruns nothing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline import io
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.servers import ReplicaError, primary_config, replica_config, server_names
from eagle3_pipeline.settings import ServerSettings


def shard_caps(server: ServerSettings) -> dict[str, int | None]:
    """Each server's max_shard_jobs (None: no cap), by name."""
    return {server.name: server.max_shard_jobs} | {r.name: r.max_shard_jobs for r in server.replicas}


def assigned_server(shard: int, names: list[str]) -> str:
    """The server shard `shard` is sent to: k mod n, stable while the list of servers is."""
    return names[shard % len(names)]


def resource_name(name: str) -> str:
    """The Snakemake resource counting generate_shard jobs against server `name` (1 each)."""
    return f"vllm_{name}"


def _weights_sizes(files: dict[str, str] | None) -> dict[str, str] | None:
    """A model fingerprint with the weights' mtimes dropped: copies on two hosts differ only there."""
    if files is None:
        return None
    return {name: value.partition(":")[0] if ":" in value else value for name, value in files.items()}


def identity_differences(primary: dict[str, Any], replica: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, primary's value, replica's value) for every identity field that differs.

    `primary` and `replica` are identity.json's `fields` with server.json's `vllm_version` added (when
    known on both). The model's path counts only when a side has no file fingerprint (a hub id, or a
    folder not readable): two hosts may keep identical copies at different paths; weights are
    compared by size (their mtimes differ between copies).
    """
    differences = []
    for key in sorted(set(primary) | set(replica)):
        a, b = primary.get(key), replica.get(key)
        if key == "model" and primary.get("model_files") and replica.get("model_files"):
            continue
        if key == "model_files":
            a, b = _weights_sizes(a), _weights_sizes(b)
        if key == "vllm_version" and (a is None or b is None):
            continue
        if a != b:
            differences.append((key, a, b))
    return differences


def check_identity(name: str, primary: dict[str, Any], replica: dict[str, Any]) -> None:
    """Raise ReplicaError naming replica `name` and each field that differs from the primary's."""
    differences = identity_differences(primary, replica)
    if differences:
        lines = "; ".join(f"{key}: {b!r} where the primary has {a!r}" for key, a, b in differences)
        raise ReplicaError(
            f"replica {name!r} does not serve what the primary serves ({lines}). Replicas must be "
            "identical (same model files, flags, template and parsers): fix its unit, or remove it "
            "from server.replicas"
        )


@dataclass(frozen=True)
class Server:
    """Where one server's files are: its snapshot, its lifecycle state and its slot folder."""

    name: str
    settings: ServerSettings  # this server's own: replica_config
    server_json: str
    state_dir: str
    slots_dir: str | None  # None: the shard journal folder's `slots/` (the primary)
    primary: bool = False


@dataclass(frozen=True)
class Fleet:
    """Every server of a run, the primary first: a generate_shard or stop_server params value.

    Not a builtin type on purpose: Snakemake does not record it as a rerun trigger, so adding a
    replica (or moving a shard to another) does not mark finished shards stale.
    """

    servers: tuple[Server, ...]

    @property
    def names(self) -> list[str]:
        return [server.name for server in self.servers]

    @property
    def primary(self) -> Server:
        return self.servers[0]

    @property
    def replicas(self) -> tuple[Server, ...]:
        return self.servers[1:]

    def for_shard(self, shard: int) -> Server:
        return self.servers[self.names.index(assigned_server(shard, self.names))]


def fleet(server: ServerSettings, results: str, work: str) -> Fleet:
    """The run's servers and their paths (results/{run}/server/replicas/NAME/, work/server/replicas/NAME)."""
    primary = Server(
        server.name,
        primary_config(server),
        f"{results}/server/server.json",
        f"{work}/server",
        None,
        primary=True,
    )
    replicas = tuple(
        Server(
            name,
            replica_config(server, name),
            f"{results}/server/replicas/{name}/server.json",
            f"{work}/server/replicas/{name}",
            f"{work}/generations/replica-slots/{name}",
        )
        for name in server_names(server)[1:]
    )
    return Fleet((primary, *replicas))


def identity_fields(identity_json: dict[str, Any], snapshot: ServerSnapshot) -> dict[str, Any]:
    """What is compared: identity.json's fields and server.json's vLLM version (None when unknown)."""
    return {**identity_json["fields"], "vllm_version": snapshot.vllm_version}


def check_replica_files(
    name: str,
    primary_identity: str,
    primary_server: str,
    replica_identity: str,
    replica_server: str,
    output: str,
) -> None:
    """The check_replica rule: compare replica `name`'s snapshot with the primary's; write the
    finding (no timestamps: rewriting it unchanged changes no byte), or raise ReplicaError."""

    def load(path: str) -> dict[str, Any]:
        return json.loads(Path(path).read_text())

    primary = load(primary_identity)
    check_identity(
        name,
        identity_fields(primary, ServerSnapshot.load(primary_server)),
        identity_fields(load(replica_identity), ServerSnapshot.load(replica_server)),
    )
    result = {"replica": name, "same_as_primary": True, "primary_identity": primary["identity"]}
    io.write_json(result, output, indent=1, sort_keys=True)


def write_checked(names: list[str], output: str) -> None:
    """check_replicas: the replicas whose identity check passed, by name (no timestamp: a rerun that
    finds the same writes the same bytes)."""
    io.write_json({"replicas": list(names)}, output, indent=1)
