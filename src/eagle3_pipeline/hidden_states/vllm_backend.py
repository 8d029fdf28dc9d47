"""The vLLM backend, pipeline side: engine settings, the interpreter, the engine's spec and staging.

The target runs in vLLM's own engine (vllm_worker.py) in an interpreter that has vLLM installed: the
pipeline's environment has none, and vLLM pins its own torch. This side plans as the transformers
backend does (sequences, batches, parts under work/) and submits the batches still to run to a
long-lived extraction engine (engine.py) shared by every extraction job of its scope
(vllm_extraction.py); packing is both backends' (packing.py).

Engine settings that change the numbers come from the served unit's snapshot (server.json), so the
states are the serving engine's: tensor_parallel_size and expert parallelism, dtype (`--dtype`),
quantization (`--quantization`), trust_remote_code, enforce_eager. What only sizes the engine is
extraction's own: max_model_len = max_seq_len + 1, an explicit max_num_batched_tokens, no CUDA graphs.
`hidden_states.vllm.*` overrides each one (null: from the snapshot).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from eagle3_pipeline import vllm_releases
from eagle3_pipeline.secrets import REDACTED
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.settings import HiddenStatesSettings, VllmEngineSettings, runtime_keys

log = logging.getLogger(__name__)

# the vLLM names this module relies on (vllm_compat.py checks them in each supported release's wheel)
VLLM_NAMES = (
    ("flag", "vllm serve", "--data-parallel-size"),
    ("flag", "vllm serve", "--dtype"),
    ("flag", "vllm serve", "--enable-expert-parallel"),
    ("flag", "vllm serve", "--enforce-eager"),
    ("flag", "vllm serve", "--quantization"),
    ("flag", "vllm serve", "--tensor-parallel-size"),
    ("env", "vllm/envs.py", "VLLM_ENABLE_V1_MULTIPROCESSING"),
)
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


# hidden_states.vllm keys that change how the engine runs, never the bytes it writes: where it runs
# (python), its memory and step sizing, CUDA graphs / eager mode (the same kernels' math, replayed or
# not), the KV connector that stages the states, pacing, timeouts and the version gate: every key the
# extraction jobs do not record (settings.py declares the others). They are no rerun trigger
# (rules/common/engine.smk) and no key of the parts' fingerprint (parts.py): lowering
# gpu_memory_utilization after an out-of-memory crash keeps every saved part.
RUNTIME_KEYS = runtime_keys(VllmEngineSettings, "extract_hidden_states")
# what the states depend on among the engine's settings: the target's code and numbers (with the
# target, the layers, max_seq_len and the storage dtype, which the plan records itself)
BYTES_KEYS = ("dtype", "quantization", "tensor_parallel_size", "enable_expert_parallel", "trust_remote_code")


def bytes_settings(engine: dict[str, Any]) -> dict[str, Any]:
    """The engine settings that change the states' bytes (BYTES_KEYS): the parts' fingerprint."""
    return {key: engine.get(key) for key in BYTES_KEYS}


class VllmBackendError(RuntimeError):
    """The vLLM backend cannot run as configured; the message names the key to fix."""


def read_snapshot(path: Path | None) -> ServerSnapshot | None:
    """server.json, or None when there is none (traces given by hand, no served unit to copy)."""
    if path is None:
        return None
    if not Path(path).exists():
        log.warning("no server snapshot at %s: engine settings from hidden_states.vllm and defaults", path)
        return None
    try:
        return ServerSnapshot.load(path)
    except (OSError, ValueError) as err:
        raise VllmBackendError(f"cannot read the server snapshot {path}: {err}") from None


def engine_settings(
    vllm: VllmEngineSettings,
    snapshot: ServerSnapshot | None,
    max_seq_len: int,
    batch_tokens: int | None = None,
) -> dict[str, Any]:
    """The extraction engine's settings: each from `hidden_states.vllm` (a None field: not set), else
    the snapshot, else a default.

    What shapes the numbers follows the served unit (TP, EP, dtype, quantization, trust_remote_code,
    enforce_eager); what only sizes the engine follows extraction: max_model_len is max_seq_len + 1 (the
    longest sequence plus the token vLLM generates), never a unit's longer context, and
    max_num_batched_tokens is explicit (with chunked prefill off vLLM would take max(max_model_len,
    16384) and size its hidden-state buffers from it). A unit served with data parallelism and no
    tensor parallelism is refused unless tensor_parallel_size is set: the engine is one LLM.

    Returns:
        {tensor_parallel_size, enable_expert_parallel, dtype, quantization, max_model_len,
        max_num_batched_tokens, trust_remote_code, enforce_eager, cuda_graphs, connector,
        gpu_memory_utilization, gpus, sources}: `sources` says where each value came from.

    Raises:
        VllmBackendError: a setting that cannot hold the sequences, or a DP unit without a TP here.
    """
    args = snapshot.args if snapshot else {}
    need = max_seq_len + 1
    from_snapshot = {
        "tensor_parallel_size": snapshot.tensor_parallel_size if snapshot else None,
        "enable_expert_parallel": bool(args.get("--enable-expert-parallel")) if snapshot else None,
        "dtype": args.get("--dtype"),
        "quantization": args.get("--quantization"),
        "trust_remote_code": snapshot.trust_remote_code if snapshot else None,
        "enforce_eager": bool(args.get("--enforce-eager")) if snapshot else None,
        "gpu_memory_utilization": None,  # memory, not numbers: the config's or vLLM's default
        "max_model_len": None,  # the unit's context sizes a server, not extraction
        "max_num_batched_tokens": None,
    }
    defaults = {
        "tensor_parallel_size": 1,
        "enable_expert_parallel": False,
        "dtype": "auto",
        "quantization": None,
        "trust_remote_code": False,
        "enforce_eager": False,
        "gpu_memory_utilization": None,
        "max_model_len": need,
        "max_num_batched_tokens": None,  # filled below from max_model_len
    }
    settings: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, default in defaults.items():
        configured = getattr(vllm, name)
        if configured is not None:
            settings[name], sources[name] = configured, "config"
        elif from_snapshot[name] is not None:
            settings[name], sources[name] = from_snapshot[name], "snapshot"
        else:
            settings[name], sources[name] = default, "default"
    data_parallel = int(args.get("--data-parallel-size") or 1)
    if data_parallel > 1 and vllm.tensor_parallel_size is None:
        ep = " --enable-expert-parallel" if args.get("--enable-expert-parallel") else ""
        tp = args.get("--tensor-parallel-size")
        raise VllmBackendError(
            f"the served unit runs --data-parallel-size {data_parallel}{ep}"
            f"{f' --tensor-parallel-size {tp}' if tp else ' and no --tensor-parallel-size'}: the "
            "extraction engine is one vLLM LLM, whose data parallelism is not run here; set "
            f"hidden_states.vllm.tensor_parallel_size to the GPUs it should use (TP x DP = "
            f"{int(tp or 1) * data_parallel}; expert parallelism is kept), or "
            "hidden_states.backend: transformers"
        )
    if settings["max_model_len"] < need:
        raise VllmBackendError(
            f"hidden_states.vllm.max_model_len {settings['max_model_len']} cannot hold a sequence of "
            f"hidden_states.max_seq_len {max_seq_len} tokens plus the one vLLM generates: set it to "
            f">= {need} or null"
        )
    served_len = snapshot.max_model_len if snapshot else None
    if served_len and served_len != settings["max_model_len"]:
        log.info("the unit's max_model_len %s not used: extraction needs %d", served_len, need)
    if settings["max_num_batched_tokens"] is None:
        settings["max_num_batched_tokens"] = max(settings["max_model_len"], batch_tokens or 0)
        sources["max_num_batched_tokens"] = "max(max_model_len, batch_tokens)"
    elif settings["max_num_batched_tokens"] < settings["max_model_len"]:
        raise VllmBackendError(
            f"hidden_states.vllm.max_num_batched_tokens {settings['max_num_batched_tokens']} is below "
            f"max_model_len {settings['max_model_len']}: with chunked prefill off (one prefill per "
            "sequence) a step must hold the longest sequence; raise it or set it to null"
        )
    settings["cuda_graphs"], sources["cuda_graphs"] = vllm.cuda_graphs, "config"
    settings["connector"], sources["connector"] = vllm.connector, "config"
    settings["gpus"] = settings["tensor_parallel_size"]  # one LLM: TP x 1 (DP is refused above)
    settings["sources"] = sources
    return settings


def check_vllm_version(version: str, allow_untested: bool) -> None:
    """Refuse a vLLM outside extraction's supported range (vllm_releases.RANGES["extract"]) unless
    `hidden_states.vllm.allow_untested_version` is set, before any engine starts.

    Raises:
        VllmBackendError: naming the version, the range and the override key.
    """
    try:
        warning = vllm_releases.check("extract", version, allow_untested)
    except vllm_releases.UnsupportedVllmError as err:
        raise VllmBackendError(
            f"{err} (check the states against hidden_states.backend: transformers)"
        ) from None
    if warning:
        log.warning("%s", warning)


def check_served_release(hidden_states: HiddenStatesSettings, snapshot: ServerSnapshot) -> None:
    """At the snapshot, before any GPU work: refuse the served unit's vLLM when extraction will run it
    (backend vllm with no hidden_states.vllm.python: the unit's own interpreter) and it is outside
    extraction's range without the override (check_vllm_version).

    Raises:
        VllmBackendError: naming the version, the range and the override key.
    """
    if hidden_states.backend == "vllm" and not hidden_states.vllm.python and snapshot.vllm_version:
        check_vllm_version(snapshot.vllm_version, hidden_states.vllm.allow_untested_version)


def vllm_version(python: str) -> str | None:
    """The vLLM version installed for `python` (its metadata, not an import: milliseconds), or None."""
    code = "import importlib.metadata as m; print(m.version('vllm'))"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _has_vllm(python: str) -> bool:
    """True when `python` runs and finds vLLM (a find_spec, not an import: milliseconds)."""
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        return subprocess.run([python, "-c", code], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def resolve_python(vllm: VllmEngineSettings, snapshot: ServerSnapshot | None) -> str:
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
    if vllm.python:
        python, origin = vllm.python, "hidden_states.vllm.python"
    elif snapshot and snapshot.python:
        python, origin = snapshot.python, "the served unit's interpreter (server.json `python`)"
    else:
        raise VllmBackendError(f"hidden_states.backend: vllm needs an interpreter with vLLM: {fix}")
    resolved = shutil.which(python) or python
    if not _has_vllm(resolved):
        raise VllmBackendError(f"{origin} {python!r} does not run or has no vLLM here: {fix}")
    version = vllm_version(resolved)
    if version:  # a source checkout without metadata is let through; the worker records its version
        check_vllm_version(version, vllm.allow_untested_version)
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


def worker_env(package_dir: Path, snapshot: ServerSnapshot | None) -> dict[str, str]:
    """The worker's environment: the served unit's VLLM_* variables under ours, no launcher's ranks."""
    env = {}
    for name, value in (snapshot.env if snapshot else {}).items():
        if name.startswith("VLLM_") and REDACTED not in str(value):  # a secret stays out
            env[name] = str(value)  # e.g. VLLM_ATTENTION_BACKEND, VLLM_CPU_KVCACHE_SPACE
    env.update({k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV})
    env["PYTHONPATH"] = str(package_dir)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the worker steps the engine while its writer thread reads the states: the engine core runs in a
    # process of its own, whatever the unit says (in-process, vLLM 0.32's CPU build stalled at the first
    # request; the demo unit sets VLLM_ENABLE_V1_MULTIPROCESSING=0 for its server)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    return env


def staging_bytes_per_token(hidden_size: int, num_states: int = 4) -> int:
    """A staged request's bytes per token: the connector writes [T, 4, H] in the engine's dtype (bf16)."""
    return num_states * hidden_size * 2


def staging_dir(vllm: VllmEngineSettings, engine_dir: Path, max_in_flight: int, hidden_size: int) -> Path:
    """Where the connector writes each request's states: the config's, else /dev/shm when it holds the
    engine's tokens in flight (staged states count in them until the writer has read them:
    engine_health.py) with as much again spare, else the engine's folder under work/ (on the run's own
    disk, in its budget)."""
    if vllm.staging_dir:
        return Path(vllm.staging_dir)
    need = 2 * max_in_flight * staging_bytes_per_token(hidden_size)
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free >= need:
        key = hashlib.sha256(str(Path(engine_dir).resolve()).encode()).hexdigest()[:12]
        return shm / f"eagle3-{os.getuid()}-{key}"
    return Path(engine_dir) / "staging"


def in_flight_tokens(vllm: VllmEngineSettings, engine: dict[str, Any]) -> int:
    """The engine's bound on tokens in flight: hidden_states.vllm.max_in_flight_tokens, else two steps'."""
    return int(vllm.max_in_flight_tokens or 2 * engine["max_num_batched_tokens"])


def engine_spec(
    target: Path,
    engine: dict[str, Any],
    layer_ids: list[int],
    storage_dtype: str,
    final_norm: dict[str, Any],
    staging: Path,
    max_in_flight: int,
    idle_timeout_s: float,
) -> dict[str, Any]:
    """What an extraction engine runs (engine.py's spec.json, read by vllm_worker.serve)."""
    return {
        "target": str(Path(target).resolve()),
        "engine": {k: v for k, v in engine.items() if k != "sources"},
        "layer_ids": layer_ids,
        "storage_dtype": storage_dtype,
        "final_norm": final_norm,
        "staging_dir": str(staging),
        "max_in_flight_tokens": max_in_flight,
        "idle_timeout_s": idle_timeout_s,
    }
