"""The run's servers as the config names them: the primary (`server`) and each of `server.replicas`,
their names, each one's settings (a replica's location keys over the primary's others), and what the
schema cannot check about them. Settings arithmetic alone: config.py checks a config with it before
any stage runs; server/replicas.py builds the run's servers from it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from eagle3_pipeline.settings import ServerSettings

NAME_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"  # a slug: used in paths and as part of a resource name
# where a replica is: its own value, or `server`'s when null (base_url: its own unit's, never inherited)
LOCATION_KEYS = ("host", "unit", "unit_file", "base_url", "tunnel")


class ReplicaError(ValueError):
    """The replicas' config, or a replica's identity, is not usable; the message names the fix."""


def server_names(server: ServerSettings) -> list[str]:
    """Every server's name, the primary first, in config order (the assignment's order)."""
    return [server.name, *(replica.name for replica in server.replicas)]


def primary_config(server: ServerSettings) -> ServerSettings:
    """The primary server's own settings: `server` without its replicas."""
    return dataclasses.replace(server, replicas=())


def replica_config(server: ServerSettings, name: str) -> ServerSettings:
    """One server's settings: the primary's, or a replica's location keys over the primary's others
    (its name and max_shard_jobs its own)."""
    if name == server.name:
        return primary_config(server)
    for replica in server.replicas:
        if replica.name == name:
            own = {key: getattr(replica, key) for key in LOCATION_KEYS if getattr(replica, key) is not None}
            return dataclasses.replace(
                primary_config(server),
                name=name,
                max_shard_jobs=replica.max_shard_jobs,
                **{"base_url": None, **own},
            )
    raise ReplicaError(f"no server named {name!r} in server.name / server.replicas")


def _location(server: ServerSettings) -> tuple[Any, ...]:
    if server.base_url:
        return ("url", server.base_url.rstrip("/"))
    return (server.host, server.unit, server.unit_file)


def config_problems(server: ServerSettings) -> list[str]:
    """What the schema cannot say about the replicas: names unique, no two naming the same server."""
    names = server_names(server)
    problems = [
        f"'server.replicas': the name {name!r} is used twice (server.name included); names must differ"
        for name in sorted({n for n in names if names.count(n) > 1})
    ]
    if problems:
        return problems
    seen: dict[tuple[Any, ...], str] = {}
    for name in names:
        where = _location(replica_config(server, name))
        if where in seen:
            problems.append(
                f"'server.replicas': {name!r} names the same server as {seen[where]!r} ({where}); give "
                "it its own host, unit, unit_file or base_url"
            )
        seen.setdefault(where, name)
    problems += [
        f"'server.replicas': name {name!r} is not allowed (a slug: {NAME_PATTERN})"
        for name in names
        if not re.match(NAME_PATTERN, name)
    ]
    return problems
