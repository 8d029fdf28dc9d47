"""Training sequences from trace rows: the server's own token ids, or a chat-template rebuild.

A sequence is `prompt_token_ids + completion_token_ids` with loss mask 0 over the prompt and 1 over
the completion (thinking and answer). Rows without token ids (an older server) are rendered through the
target's chat template with the thinking kept in the final assistant turn; the loss mask then covers
what the template adds after the generation prompt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from eagle3_pipeline.target_shape import AuxLayerError, aux_layers

log = logging.getLogger(__name__)

OVERLONG_POLICIES = ("truncate", "drop")
TRACE_COLUMNS = (
    "id",
    "shard",
    "system",
    "question",
    "reasoning",
    "content",
    "prompt_token_ids",
    "completion_token_ids",
    "status",
)


class SequenceError(ValueError):
    """A trace row or setting that cannot become a training sequence; the message names the fix."""


@dataclass
class TrainingSequence:
    """One sample: token ids and a 0/1 loss mask of the same length."""

    id: str
    input_ids: list[int]
    loss_mask: list[int]
    rebuilt: bool = False

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class SequenceStats:
    """What building the sequences of a shard did, for the shard metadata."""

    rows: int = 0
    skipped_status: int = 0
    rebuilt_from_template: int = 0
    truncated: int = 0
    dropped: int = 0
    dropped_ids: list[str] = field(default_factory=list)


def resolve_layers(spec: str | Sequence[int | str], num_layers: int) -> list[int]:
    """The three aux layers (0-indexed decoder-layer outputs) by target_shape.aux_layers, the one rule;
    a bad `spec` as a SequenceError, as the shard's other problems."""
    try:
        return aux_layers(spec, num_layers)
    except AuxLayerError as err:
        raise SequenceError(str(err)) from err


def load_trace_rows(path: str | Path, shard: int) -> list[dict[str, Any]]:
    """The rows of one trace shard, in file order, with the columns this stage reads.

    Raises:
        SequenceError: when the parquet lacks the `id` or `shard` column.
    """
    schema = pl.read_parquet_schema(path)
    missing = [c for c in ("id", "shard") if c not in schema]
    if missing:
        raise SequenceError(f"{path}: missing column(s) {missing}; it must come from rule merge_traces")
    columns = [c for c in TRACE_COLUMNS if c in schema]
    frame = pl.scan_parquet(path).filter(pl.col("shard") == shard).select(columns).collect()
    return frame.to_dicts()


def _has_ids(value: Any) -> bool:
    return value is not None and len(value) > 0


def sequence_from_ids(row: dict[str, Any]) -> TrainingSequence:
    """Prompt ids (mask 0) + completion ids (mask 1), exactly as the server returned them."""
    prompt = [int(x) for x in row["prompt_token_ids"]]
    completion = [int(x) for x in row["completion_token_ids"]]
    return TrainingSequence(str(row["id"]), prompt + completion, [0] * len(prompt) + [1] * len(completion))


def _messages(row: dict[str, Any], with_answer: bool) -> list[dict[str, str]]:
    messages = []
    if row.get("system"):
        messages.append({"role": "system", "content": row["system"]})
    messages.append({"role": "user", "content": row.get("question") or ""})
    if with_answer:
        reasoning = row.get("reasoning") or ""
        messages.append(
            {
                "role": "assistant",
                "content": row.get("content") or "",
                "reasoning_content": reasoning,  # Kimi / DeepSeek templates
                "reasoning": reasoning,  # templates that read the newer field name
            }
        )
    return messages


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def sequence_from_template(row: dict[str, Any], tokenizer: Any) -> TrainingSequence:
    """Render [system?, user, assistant(reasoning + content)] and mask what follows the prompt.

    The generation prompt (`add_generation_prompt=True`) is the masked-out part; everything the full
    rendering adds after it (for a Kimi-style template `reasoning</think>content<|im_end|>`) is trained
    on. Templates that drop the thinking get it back as `<think>reasoning</think>content`.
    """
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise SequenceError(
            f"trace {row.get('id')!r} has no token ids and the target tokenizer has no chat template; "
            "regenerate with a vLLM that returns token ids or add a chat_template to the target"
        )
    prompt = tokenizer.apply_chat_template(_messages(row, False), tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(_messages(row, True), tokenize=False, add_generation_prompt=False)
    reasoning = row.get("reasoning") or ""
    if reasoning and reasoning not in full:
        log.warning(
            "chat template drops the thinking of %s; rendering <think>...</think> into content", row["id"]
        )
        fallback = dict(row, reasoning="", content=f"<think>{reasoning}</think>{row.get('content') or ''}")
        full = tokenizer.apply_chat_template(_messages(fallback, True), tokenize=False)
    start = _common_prefix(prompt, full)
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [1 if end > start else 0 for _, end in encoded["offset_mapping"]]
    return TrainingSequence(str(row["id"]), list(encoded["input_ids"]), mask, rebuilt=True)


def apply_length_policy(
    seq: TrainingSequence, max_seq_len: int, policy: str, stats: SequenceStats
) -> TrainingSequence | None:
    """Keep, truncate (first max_seq_len tokens) or drop an overlong sequence; counted in `stats`.

    A truncated sequence with no completion token left is dropped (nothing to learn from it).
    """
    if len(seq) <= max_seq_len:
        return seq
    if policy == "truncate":
        seq = TrainingSequence(seq.id, seq.input_ids[:max_seq_len], seq.loss_mask[:max_seq_len], seq.rebuilt)
        if any(seq.loss_mask):
            stats.truncated += 1
            return seq
    stats.dropped += 1
    stats.dropped_ids.append(seq.id)
    return None


def build_sequences(
    rows: list[dict[str, Any]],
    max_seq_len: int,
    policy: str,
    tokenizer_loader: Callable[[], Any],
) -> tuple[list[TrainingSequence], SequenceStats]:
    """Training sequences for a shard's trace rows, in row order.

    Args:
        rows: trace rows (see `load_trace_rows`).
        max_seq_len: longest sequence kept whole.
        policy: "truncate" or "drop" for longer ones.
        tokenizer_loader: returns the target tokenizer; called only if some row needs a rebuild.

    Raises:
        SequenceError: on an unknown policy, a duplicate id, or a row with neither ids nor text.
    """
    if policy not in OVERLONG_POLICIES:
        raise SequenceError(f"hidden_states.overlong: {policy!r} must be one of {OVERLONG_POLICIES}")
    stats, sequences, seen, tokenizer = SequenceStats(rows=len(rows)), [], set(), None
    for row in rows:
        if row.get("status") not in (None, "ok"):
            stats.skipped_status += 1
            continue
        if row["id"] in seen:
            raise SequenceError(f"trace id {row['id']!r} appears twice in the shard; rerun merge_traces")
        seen.add(row["id"])
        if _has_ids(row.get("prompt_token_ids")) and _has_ids(row.get("completion_token_ids")):
            seq = sequence_from_ids(row)
        else:
            tokenizer = tokenizer or tokenizer_loader()
            seq = sequence_from_template(row, tokenizer)
            stats.rebuilt_from_template += 1
        seq = apply_length_policy(seq, max_seq_len, policy, stats)
        if seq is not None:
            sequences.append(seq)
    return sequences, stats


def longest_first_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Group sample indices into batches of at most `batch_tokens` padded tokens.

    Samples are sorted by length (longest first) so that padding stays small; a sample longer than
    the budget gets a batch of its own. Deterministic for given lengths and budget.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = lengths[current[0]] if current else lengths[i]  # longest first: the first sets the width
        if current and width * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches
