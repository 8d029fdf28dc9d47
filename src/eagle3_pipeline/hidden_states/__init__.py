"""Hidden states of the target over each full conversation, packed per shard for draft training.

Modules: `sequences` (token ids and loss masks from traces), `capture` (running the target, layer
hooks), `storage` (packed safetensors: writer, validation, memory-mapped reader `HiddenStateShard`),
`extract` (the per-shard job with resume). See docs/hidden_states.md.
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
