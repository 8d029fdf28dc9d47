"""A shard's plan, before any state is computed: the target's shape, the aux layers, the sequences
built from the shard's trace rows and their batches. Both backends plan alike."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline.hidden_states import capture, sequences
from eagle3_pipeline.hidden_states.job import ShardJob
from eagle3_pipeline.hidden_states.sequences import TrainingSequence
from eagle3_pipeline.settings import HiddenStatesSettings
from eagle3_pipeline.target_shape import TargetShape, vllm_layer_ids

log = logging.getLogger(__name__)


@dataclass
class TargetInfo:
    num_layers: int
    hidden_size: int
    vocab_size: int
    config_sha: str


def target_info(target: Path, trust_remote_code: bool = False) -> TargetInfo:
    """Layer count, hidden size and vocab of the target's language model, from its config.json.

    Read from the JSON itself when it states the three (TargetShape.stated_shape): the same values
    transformers' AutoConfig loads, without importing transformers, which was most of an extraction
    client's planning (5.1 of 5.2 s for a 108k-token shard on a loaded 2-core machine) while the engine
    waited for its request. Anything else goes through AutoConfig."""
    shape = TargetShape.load(target)
    stated = shape.stated_shape()
    if stated is not None:
        return TargetInfo(*stated, shape.sha256)
    from transformers import AutoConfig

    model_config = AutoConfig.from_pretrained(str(target), trust_remote_code=trust_remote_code)
    text = capture.text_config(model_config)
    return TargetInfo(text.num_hidden_layers, text.hidden_size, text.vocab_size, shape.sha256)


@dataclass
class ShardPlan:
    """One shard's sequences and batches, before any state is computed."""

    job: ShardJob
    info: TargetInfo
    layers: list[int]
    seqs: list[TrainingSequence]
    stats: sequences.SequenceStats
    batches: list[list[int]]


def plan_shard(hidden_states: HiddenStatesSettings, job: ShardJob) -> ShardPlan:
    """Read the shard's trace rows and build its sequences and batches.

    Raises:
        sequences.SequenceError: bad trace rows or settings.
    """
    info = target_info(job.target, hidden_states.trust_remote_code)
    layers = sequences.resolve_layers(hidden_states.layers, info.num_layers)
    rows = sequences.load_trace_rows(job.traces, job.shard)
    seqs, stats = sequences.build_sequences(
        rows,
        hidden_states.max_seq_len,
        hidden_states.overlong,
        tokenizer_loader(job.target, hidden_states.trust_remote_code),
    )
    batches = sequences.longest_first_batches([len(s) for s in seqs], hidden_states.batch_tokens)
    log.info(
        "shard %d: %d rows -> %d sequences, %d tokens, %d batches; aux layers %s (vLLM ids %s)",
        job.shard,
        len(rows),
        len(seqs),
        sum(map(len, seqs)),
        len(batches),
        layers,
        vllm_layer_ids(layers),
    )
    return ShardPlan(job, info, layers, seqs, stats, batches)


def tokenizer_loader(target: Path, trust_remote_code: bool) -> Callable[[], Any]:
    """Loads the target's tokenizer when called: only rows without token ids need it."""

    def load() -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(target), trust_remote_code=trust_remote_code)

    return load
