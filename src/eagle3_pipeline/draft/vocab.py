"""The draft vocabulary: the target's most frequent loss-masked tokens, as d2t / t2d.

d2t[i] = used[i] - i (int64): vLLM and SGLang add it to arange(Vd) to map a draft id to a target id.
t2d (bool over the target vocab) marks the target ids the draft can emit.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import load_file

from eagle3_pipeline import io

log = logging.getLogger(__name__)


def count_loss_tokens(metadata_paths: Iterable[str | Path]) -> Counter[int]:
    """Sum the per-shard `token_counts` (ids counted where loss_mask == 1) of hidden-state metadata."""
    counts: Counter[int] = Counter()
    for path in metadata_paths:
        meta = json.loads(Path(path).read_text())
        if "token_counts" not in meta:
            raise ValueError(f"{path} has no 'token_counts'; rebuild it with rule extract_hidden_states")
        counts.update({int(k): int(v) for k, v in meta["token_counts"].items()})
    return counts


def count_trace_tokens(trace_paths: Iterable[str | Path], max_seq_len: int, overlong: str) -> Counter[int]:
    """Loss-masked token counts straight from per-shard trace files, as extraction would store them.

    For windowed training (hidden_states.max_disk_gb), where the vocabulary must be known before the
    first window's states exist. Same sequences as extraction (hidden_states.sequences): prompt ids
    masked out, completion ids counted, the same length policy; rows need the server's token ids.
    """
    from eagle3_pipeline.hidden_states.sequences import SequenceError, build_sequences, load_trace_rows
    from eagle3_pipeline.traces.schema import shard_number

    def no_tokenizer() -> None:
        raise SequenceError("a trace without token ids: windowed training needs the server's token ids")

    counts: Counter[int] = Counter()
    for path in trace_paths:
        rows = load_trace_rows(path, shard_number(path))
        seqs, _ = build_sequences(rows, max_seq_len, overlong, no_tokenizer)
        counts.update(t for seq in seqs for t, m in zip(seq.input_ids, seq.loss_mask, strict=True) if m)
    return counts


def select_draft_ids(counts: Counter[int], target_vocab_size: int, draft_vocab_size: int) -> torch.Tensor:
    """The draft's target ids, ascending: the `draft_vocab_size` most frequent (ties: lower id first).

    A target vocabulary no larger than draft_vocab_size is kept whole. When fewer distinct ids were seen
    than the draft holds, the lowest unseen ids fill it, so the draft vocabulary has a fixed size.
    """
    size = min(draft_vocab_size, target_vocab_size)
    bad = [i for i in counts if not 0 <= i < target_vocab_size]
    if bad:
        raise ValueError(
            f"token ids {sorted(bad)[:5]} are outside the target vocabulary ({target_vocab_size})"
        )
    ranked = sorted(counts, key=lambda i: (-counts[i], i))[:size]
    chosen = set(ranked)
    filler = (i for i in range(target_vocab_size) if i not in chosen)
    while len(chosen) < size:
        chosen.add(next(filler))
    return torch.tensor(sorted(chosen), dtype=torch.int64)


def vocab_map(used: torch.Tensor, target_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t int64 [Vd], t2d bool [V]) for the ascending target ids `used`."""
    d2t = used - torch.arange(len(used), dtype=torch.int64)
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d


def draft_ids(d2t: torch.Tensor) -> torch.Tensor:
    """The target id of each draft id: arange(Vd) + d2t."""
    return torch.arange(len(d2t), dtype=torch.int64) + d2t


def build_vocab_map(
    metadata_paths: Iterable[str | Path],
    target_vocab_size: int,
    draft_vocab_size: int,
    output: str | Path,
    counts: Counter[int] | None = None,
) -> None:
    """Count (from the metadata, unless `counts` are given), select and write d2t / t2d to `output`."""
    counts = count_loss_tokens(metadata_paths) if counts is None else counts
    if not counts:
        raise ValueError("no loss-masked tokens in the hidden-state shards: the traces have no completions")
    used = select_draft_ids(counts, target_vocab_size, draft_vocab_size)
    d2t, t2d = vocab_map(used, target_vocab_size)
    covered = sum(counts[int(i)] for i in used) / sum(counts.values())
    log.info(
        "draft vocabulary %d of %d target ids; %d distinct ids seen; covers %.4f of loss tokens",
        len(used),
        target_vocab_size,
        len(counts),
        covered,
    )
    io.write_safetensors({"d2t": d2t, "t2d": t2d}, output, metadata={"coverage": f"{covered:.6f}"})


def load_vocab_map(path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    tensors = load_file(str(path))
    return tensors["d2t"], tensors["t2d"]
