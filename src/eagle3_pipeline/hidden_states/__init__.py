"""Hidden states of the target over each full conversation, packed per shard for draft training.

Modules: `sequences` (token ids and loss masks from traces), `capture` (running the target, layer
hooks), `storage` (packed safetensors: writer, validation, memory-mapped reader `HiddenStateShard`),
`extract` (the per-shard job with resume). See docs/hidden_states.md.
"""

from eagle3_pipeline.hidden_states.storage import HiddenStateShard

__all__ = ["HiddenStateShard"]
