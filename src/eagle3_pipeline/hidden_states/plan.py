"""A shard's plan, before any state is computed: the target's shape, the aux layers, the sequences
built from the shard's trace rows and their batches. Both backends plan alike."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline.hidden_states import capture, sequences
from eagle3_pipeline.hidden_states.job import ShardJob
from eagle3_pipeline.hidden_states.sequences import TrainingSequence
from eagle3_pipeline.settings import HiddenStatesSettings

log = logging.getLogger(__name__)


@dataclass
class TargetInfo:
    num_layers: int
    hidden_size: int
    vocab_size: int
    config_sha: str


def target_info(target: Path, trust_remote_code: bool = False) -> TargetInfo:
    """Layer count, hidden size and vocab of the target's language model, from its config.json."""
    from transformers import AutoConfig

    model_config = AutoConfig.from_pretrained(str(target), trust_remote_code=trust_remote_code)
    text = capture.text_config(model_config)
    sha = hashlib.sha256((Path(target) / "config.json").read_bytes()).hexdigest()
    return TargetInfo(text.num_hidden_layers, text.hidden_size, text.vocab_size, sha)


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
        sequences.vllm_layer_ids(layers),
    )
    return ShardPlan(job, info, layers, seqs, stats, batches)


def tokenizer_loader(target: Path, trust_remote_code: bool) -> Callable[[], Any]:
    """Loads the target's tokenizer when called: only rows without token ids need it."""

    def load() -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(target), trust_remote_code=trust_remote_code)

    return load
