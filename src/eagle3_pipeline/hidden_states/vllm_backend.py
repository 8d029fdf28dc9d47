"""The vLLM backend, pipeline side: engine settings from the snapshot, the interpreter, the worker run.

The target runs in vLLM's own engine (vllm_worker.py) in an interpreter that has vLLM installed: the
pipeline's environment has none, and vLLM pins its own torch. This side plans as the transformers
backend does (sequences, batches, parts under work/), writes one job file naming every batch still to
run and its part file, runs the worker once for all splits of a job (the engine starts once), and
leaves the packing to extract.py.

Engine settings that change the numbers come from the served unit's snapshot (server.json), so the
states are the serving engine's: tensor_parallel_size, dtype (`--dtype`), quantization
(`--quantization`), trust_remote_code, max_model_len; and enforce_eager (CUDA graphs change kernels).
`hidden_states.vllm.*` overrides each one (null: from the snapshot).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from eagle3_pipeline import io
from eagle3_pipeline.server.secrets import REDACTED
from eagle3_pipeline.settings import VllmEngineSettings, section

log = logging.getLogger(__name__)

WORKER_MODULE = "eagle3_pipeline.hidden_states.vllm_worker"
# Set by `accelerate launch` / torchrun for the pipeline's process; vLLM must build its own world.
DISTRIBUTED_ENV = frozenset(
    [
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "GROUP_RANK",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "TORCHELASTIC_RUN_ID",
    ]
)


class VllmBackendError(RuntimeError):
    """The vLLM backend cannot run as configured; the message names the key to fix."""


# `hidden_states.vllm` from the config, typed once in settings.py: None = from the snapshot (or vLLM's
# default)
VllmOptions = VllmEngineSettings


def vllm_options(data: dict[str, Any] | None) -> VllmOptions:
    """`hidden_states.vllm` as read from a job file, refusing a key the schema does not know."""
    try:
        return section(VllmEngineSettings, data)
    except TypeError as err:
        raise VllmBackendError(f"hidden_states.vllm: {err}") from err


def read_snapshot(path: Path | None) -> dict[str, Any] | None:
    """server.json, or None when there is none (traces given by hand, no served unit to copy)."""
    if path is None:
        return None
    if not Path(path).exists():
        log.warning("no server snapshot at %s: engine settings from hidden_states.vllm and defaults", path)
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise VllmBackendError(f"cannot read the server snapshot {path}: {err}") from None


def engine_settings(
    options: VllmOptions, snapshot: dict[str, Any] | None, max_seq_len: int
) -> dict[str, Any]:
    """The engine's settings: each from `hidden_states.vllm`, else the snapshot, else vLLM's default.

    max_model_len must hold the longest sequence plus the one token vLLM generates: the snapshot's value
    is raised to max_seq_len + 1 when smaller (a server whose completions filled its context gives
    sequences of exactly max_model_len tokens); an explicit `hidden_states.vllm.max_model_len` below
    that is refused.

    Returns:
        {tensor_parallel_size, dtype, quantization, max_model_len, trust_remote_code, enforce_eager,
        gpu_memory_utilization, sources}: `sources` says where each value came from.
    """
    snap = snapshot or {}
    args = snap.get("args") or {}
    from_snapshot = {
        "tensor_parallel_size": snap.get("tensor_parallel_size"),
        "dtype": args.get("--dtype"),
        "quantization": args.get("--quantization"),
        "max_model_len": snap.get("max_model_len"),
        "trust_remote_code": snap.get("trust_remote_code") if snapshot else None,
        "enforce_eager": bool(args.get("--enforce-eager")) if snapshot else None,
        "gpu_memory_utilization": None,  # memory, not numbers: the config's or vLLM's default
    }
    defaults = {
        "tensor_parallel_size": 1,
        "dtype": "auto",
        "quantization": None,
        "max_model_len": max_seq_len + 1,
        "trust_remote_code": False,
        "enforce_eager": False,
        "gpu_memory_utilization": None,
    }
    settings: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, default in defaults.items():
        configured = getattr(options, name)
        if configured is not None:
            settings[name], sources[name] = configured, "config"
        elif from_snapshot[name] is not None:
            settings[name], sources[name] = from_snapshot[name], "snapshot"
        else:
            settings[name], sources[name] = default, "default"
    need = max_seq_len + 1
    if settings["max_model_len"] < need:
        if sources["max_model_len"] == "config":
            raise VllmBackendError(
                f"hidden_states.vllm.max_model_len {settings['max_model_len']} cannot hold a sequence of "
                f"hidden_states.max_seq_len {max_seq_len} tokens plus the one vLLM generates: set it to "
                f">= {need} or null"
            )
        log.info("max_model_len %d (snapshot) raised to %d", settings["max_model_len"], need)
        settings["max_model_len"], sources["max_model_len"] = need, "max_seq_len"
    settings["sources"] = sources
    return settings


def _has_vllm(python: str) -> bool:
    """True when `python` runs and finds vLLM (a find_spec, not an import: milliseconds)."""
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        return subprocess.run([python, "-c", code], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def resolve_python(options: VllmOptions, snapshot: dict[str, Any] | None) -> str:
    """The interpreter that runs vLLM: `hidden_states.vllm.python`, else the served unit's own Python.

    The snapshot records the unit's interpreter (`python`: the word before `-m vllm...`, or the shebang
    of its `vllm` script) when it could read it; on another host that path usually does not exist here,
    which is an error naming the key.

    Raises:
        VllmBackendError: no interpreter, or one without vLLM.
    """
    fix = (
        "set hidden_states.vllm.python to a Python that has vLLM installed (the demo: "
        ".venv-vllm/bin/python), or hidden_states.backend: transformers"
    )
    if options.python:
        python, origin = options.python, "hidden_states.vllm.python"
    elif snapshot and snapshot.get("python"):
        python, origin = snapshot["python"], "the served unit's interpreter (server.json `python`)"
    else:
        raise VllmBackendError(f"hidden_states.backend: vllm needs an interpreter with vLLM: {fix}")
    resolved = shutil.which(python) or python
    if not _has_vllm(resolved):
        raise VllmBackendError(f"{origin} {python!r} does not run or has no vLLM here: {fix}")
    return str(Path(resolved).absolute())


def package_path(scratch: Path) -> Path:
    """A folder holding only this package (a symlink), for the worker's PYTHONPATH.

    The worker imports eagle3_pipeline from the pipeline's checkout or site-packages without that
    environment's other packages (the pipeline's torch must not shadow vLLM's).
    """
    import eagle3_pipeline

    folder = scratch / "pythonpath"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "eagle3_pipeline"
    if not link.exists():
        link.symlink_to(Path(eagle3_pipeline.__file__).resolve().parent, target_is_directory=True)
    return folder


def worker_env(package_dir: Path, snapshot: dict[str, Any] | None) -> dict[str, str]:
    """The worker's environment: the served unit's VLLM_* variables under ours, no launcher's ranks."""
    env = {}
    for name, value in ((snapshot or {}).get("env") or {}).items():
        if name.startswith("VLLM_") and REDACTED not in str(value):  # a secret stays out
            env[name] = str(value)  # e.g. VLLM_ATTENTION_BACKEND, VLLM_CPU_KVCACHE_SPACE
    env.update({k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV})
    env["PYTHONPATH"] = str(package_dir)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def run_worker(python: str, job: dict[str, Any], snapshot: dict[str, Any] | None) -> None:
    """Run every batch of `job` in one vLLM engine; the engine's log goes to our stderr (the rule's log).

    Raises:
        VllmBackendError: the worker failed (its own error is the last lines of the log).
    """
    with tempfile.TemporaryDirectory(prefix="eagle3-vllm-") as tmp:
        scratch = Path(tmp)
        job = {**job, "scratch": str(scratch / "states")}  # vLLM's per-request files, read and removed
        job_file = scratch / "job.json"
        io.write_json(job, job_file, indent=None)
        env = worker_env(package_path(scratch), snapshot)
        command = [python, "-m", WORKER_MODULE, str(job_file)]
        log.info("vLLM worker: %s (%d batches)", " ".join(command), len(job["batches"]))
        start = time.perf_counter()
        sys.stderr.flush()
        try:
            sink: Any = sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):
            sink = None  # a captured stderr without a file (pytest): the child inherits ours
        result = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink)
        if result.returncode != 0:
            raise VllmBackendError(
                f"the vLLM worker exited with status {result.returncode}; its error is in the log above "
                "(a target vLLM cannot run: hidden_states.backend: transformers)"
            )
        log.info("vLLM worker done in %.1f s", time.perf_counter() - start)


def job_spec(
    target: Path,
    engine: dict[str, Any],
    layer_ids: list[int],
    storage_dtype: str,
    final_norm: dict[str, Any],
    records: list[Path],
    batches: list[dict[str, Any]],
) -> dict[str, Any]:
    """The worker's job file (see vllm_worker.run_job)."""
    return {
        "target": str(Path(target).resolve()),
        "engine": {k: v for k, v in engine.items() if k != "sources"},
        "layer_ids": layer_ids,
        "storage_dtype": storage_dtype,
        "final_norm": final_norm,
        "records": [str(p) for p in records],
        "batches": batches,
    }
