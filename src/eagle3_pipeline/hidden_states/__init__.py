"""Hidden states of the target over each full conversation, packed per shard for draft training.

Modules: `extract` (the job's entry point, by backend), `job` (a job and its file), `plan` (a shard's
sequences and batches), `parts` (resumable per-batch parts), `packing` (parts into the packed shard
and its metadata), `transformers_extraction` and `vllm_extraction` (the two backends; `vllm_backend`,
`engine`, `engine_health`, `vllm_worker`, `engine_loop`, `vllm_connector` and `final_norm` serve the
second), `sequences` (token ids
and loss masks from traces), `capture` (running the target, layer hooks), `storage` (packed
safetensors: writer, validation, memory-mapped reader `HiddenStateShard`), `cost` (a config's
extraction cost). See docs/hidden_states.md.
"""

from typing import Any

__all__ = ["HiddenStateShard"]


def __getattr__(name: str) -> Any:
    # on first use, not at import: the workflow imports this package (engine.stop_all) every time a
    # Snakefile is parsed, and storage imports torch (1.5 s of every `snakemake -n`)
    if name == "HiddenStateShard":
        from eagle3_pipeline.hidden_states.storage import HiddenStateShard

        return HiddenStateShard
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
