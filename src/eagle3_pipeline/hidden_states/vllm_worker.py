"""The vLLM side of the vLLM backend: one offline engine runs every batch of a job into its part file.

Run as `VLLM_PYTHON -m eagle3_pipeline.hidden_states.vllm_worker JOB.json` by `vllm_backend.run_worker`,
in an interpreter that has vLLM (the pipeline's has none, and vLLM pins its own torch). Imports only
vLLM, torch, safetensors and this package's light modules (no polars, transformers or accelerate
at module level), so the spawned engine processes import it cheaply.

The engine is vLLM's speculative method `extract_hidden_states` with our `SyncHiddenStatesConnector`
(vllm_connector.py): each sequence, the server's own token ids, is sent as a prompt with
`max_tokens=1`; the connector writes its states, [tokens, 4, H] for the layer ids
[aux..., num_hidden_layers], to a scratch file. The three aux states are concatenated in layer order
and the fourth (before the final norm) goes through the target's final RMSNorm (final_norm.py); each
batch is saved as one part, atomically, in the transformers backend's part format.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from eagle3_pipeline import io
from eagle3_pipeline.hidden_states import final_norm, storage
from eagle3_pipeline.logs import setup_logging

log = logging.getLogger("eagle3_pipeline.hidden_states.vllm_worker")
CONNECTOR = "SyncHiddenStatesConnector"
CONNECTOR_MODULE = "eagle3_pipeline.hidden_states.vllm_connector"
FALLBACK = "set hidden_states.backend: transformers to extract with transformers instead"


class WorkerError(RuntimeError):
    """The engine could not run the job; the message names the fix."""


def engine_kwargs(job: dict[str, Any]) -> dict[str, Any]:
    """`vllm.LLM` arguments: the job's engine settings plus what extraction itself needs."""
    from vllm.config import KVTransferConfig

    engine = job["engine"]
    kwargs: dict[str, Any] = {
        "model": job["target"],
        # ids in, ids out: no tokenizer to load (or to trust). vLLM then logs a harmless
        # "Chat template warmup failed ... Tokenizer not available" warning at start.
        "skip_tokenizer_init": True,
        "speculative_config": {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": job["layer_ids"]}},
        },
        "kv_transfer_config": KVTransferConfig(
            kv_connector=CONNECTOR,
            kv_connector_module_path=CONNECTOR_MODULE,
            kv_role="kv_producer",
            kv_connector_extra_config={"shared_storage_path": job["scratch"]},
        ),
        "enable_chunked_prefill": False,  # a sequence's states come from one prefill
        "enable_prefix_caching": False,  # every state is computed, none reused from another request
        "tensor_parallel_size": engine["tensor_parallel_size"],
        "dtype": engine["dtype"],
        "max_model_len": engine["max_model_len"],
        "trust_remote_code": engine["trust_remote_code"],
        "enforce_eager": engine["enforce_eager"],
        "seed": 0,
    }
    for optional in ("quantization", "gpu_memory_utilization"):
        if engine.get(optional) is not None:
            kwargs[optional] = engine[optional]
    return kwargs


def check_architecture(target: str, trust_remote_code: bool) -> None:
    """Refuse, before any engine starts, a target whose architecture vLLM has no model for."""
    from vllm import ModelRegistry

    config = json.loads((Path(target) / "config.json").read_text())
    archs = config.get("architectures") or []
    if trust_remote_code and config.get("auto_map"):
        return  # remote code: vLLM may still run it through its Transformers fallback; the engine decides
    if not set(archs) & set(ModelRegistry.get_supported_archs()):
        raise WorkerError(f"vLLM {_version()} has no model for {archs} ({target}); {FALLBACK}")


def _version() -> str:
    import vllm

    return vllm.__version__


def make_engine(job: dict[str, Any]) -> Any:
    """The offline engine; any failure to build it comes back naming the transformers fallback."""
    from vllm import LLM

    check_architecture(job["target"], job["engine"]["trust_remote_code"])
    kwargs = engine_kwargs(job)
    try:
        return LLM(**kwargs)
    except Exception as err:
        raise WorkerError(
            f"vLLM {_version()} could not run {job['target']} with extract_hidden_states "
            f"({type(err).__name__}: {err}); see the engine's log above, or {FALLBACK}"
        ) from err


def engine_record(llm: Any, job: dict[str, Any]) -> dict[str, Any]:
    """What the engine really ran with, for the shard metadata."""
    config = llm.llm_engine.vllm_config
    return {
        "vllm_version": _version(),
        "dtype": str(config.model_config.dtype).removeprefix("torch."),
        "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
        "quantization": config.model_config.quantization,
        "max_model_len": config.model_config.max_model_len,
        "trust_remote_code": config.model_config.trust_remote_code,
        "enforce_eager": config.model_config.enforce_eager,
        "layer_ids": job["layer_ids"],
        "device": str(config.device_config.device),
    }


def read_states(output: Any, ids: list[int]) -> torch.Tensor:
    """[tokens, len(layer_ids), H] states of one request, after its file is written (flock wait)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        cleanup_hidden_states,
        load_hidden_states,
    )

    path = (output.kv_transfer_params or {}).get("hidden_states_path")
    if not path:
        raise WorkerError(f"request {output.request_id}: the engine returned no hidden_states_path")
    data = load_hidden_states(path)
    cleanup_hidden_states(path)
    if data["token_ids"].tolist() != ids or data["hidden_states"].shape[0] != len(ids):
        raise WorkerError(
            f"request {output.request_id}: the engine's states cover {data['token_ids'].shape[0]} tokens "
            f"that differ from the {len(ids)} sent"
        )
    return data["hidden_states"]


def run_batch(
    llm: Any, batch: dict[str, Any], weight: torch.Tensor, eps: float, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """One batch's part: {index, aux_hidden_states [T, 3H], final_hidden_states [T, H]} (post-norm)."""
    from vllm import SamplingParams, TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in batch["input_ids"]]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    aux, final = [], []
    for output, ids in zip(outputs, batch["input_ids"], strict=True):
        states = read_states(output, ids)
        tokens, _, hidden = states.shape
        aux.append(states[:, :3].reshape(tokens, 3 * hidden).to(dtype))
        final.append(final_norm.rms_norm(states[:, 3], weight, eps).to(dtype))
    return {
        "index": torch.tensor(batch["index"], dtype=torch.int64),
        "aux_hidden_states": torch.cat(aux),
        "final_hidden_states": torch.cat(final),
    }


def run_job(job: dict[str, Any]) -> None:
    """Start the engine, record its settings, then save a part for every batch of the job."""
    norm = final_norm.FinalNorm(**job["final_norm"])
    weight = final_norm.load_weight(norm)
    dtype = storage.TORCH_DTYPES[job["storage_dtype"]]
    start = time.perf_counter()
    llm = make_engine(job)  # includes vLLM's import
    log.info("engine ready in %.1f s (vLLM's import included)", time.perf_counter() - start)
    record = {**engine_record(llm, job), "engine_start_s": round(time.perf_counter() - start, 2)}
    for path in job["records"]:
        storage.write_json(record, Path(path))
    total_tokens, extract_s = 0, 0.0
    for done, batch in enumerate(job["batches"], 1):
        start = time.perf_counter()
        tensors = run_batch(llm, batch, weight, norm.eps, dtype)
        io.write_safetensors(tensors, Path(batch["part"]))
        tokens = tensors["aux_hidden_states"].shape[0]
        total_tokens, extract_s = total_tokens + tokens, extract_s + time.perf_counter() - start
        log.info(
            "part %s (%d/%d): %d samples, %d tokens, %.0f tokens/s",
            Path(batch["part"]).name,
            done,
            len(job["batches"]),
            len(batch["index"]),
            tokens,
            tokens / max(time.perf_counter() - start, 1e-9),
        )
    # this run's figures (a resumed job's are those of its last run)
    record["last_run"] = {
        "batches": len(job["batches"]),
        "tokens": total_tokens,
        "extract_s": round(extract_s, 2),
    }
    for path in job["records"]:
        storage.write_json(record, Path(path))


def main(argv: list[str]) -> int:
    setup_logging(None, "vllm_worker")  # stderr is the extraction job's log
    if len(argv) != 1:
        print("usage: python -m eagle3_pipeline.hidden_states.vllm_worker JOB.json", file=sys.stderr)  # noqa: T201
        return 2
    try:
        run_job(json.loads(Path(argv[0]).read_text()))
    except (WorkerError, final_norm.FinalNormError) as err:
        log.error("%s", err)
        return 3
    return 0


if __name__ == "__main__":  # spawned engine processes re-import this module: keep the guard
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main(sys.argv[1:]))
