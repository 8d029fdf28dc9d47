"""Questions from a chat dataset, with stable ids, in shards whose membership never changes.

Reads open-perfectblend's format (`conversations: [{from: human|gpt|system, value}]`, `source`) and
OpenAI/ShareGPT-style rows (`messages` or `conversations` of `{role, content}`), from a .jsonl, a
.parquet, a folder of parquet files or an `hf://datasets/ORG/NAME` path. A damaged row is never fatal:
it is counted and its reason kept in the skipped table.

A question's id hashes the row's normalised messages, its source and the turn index, so it depends
neither on the file format nor on shard size or num_samples. The selection orders every usable
question by `hash(id, seed)` and takes a prefix, written in blocks of SELECTION_BLOCK_SHARDS shards
(prompts/selection-{b:05d}.parquet holds questions [b * B, (b + 1) * B) of the order, B = 64 x
shard_size, whatever num_samples is); shard k is rows [k * shard_size, (k + 1) * shard_size) of the
order. Raising num_samples adds blocks and shards and leaves every done block and full shard alone.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

log = logging.getLogger(__name__)

# Rows per row group of the selection: a shard job reads only the groups its rows fall in.
SELECTION_ROW_GROUP = 1024
# Shards per selection block. A block's content depends on the dataset, seed, turns and shard_size,
# never on num_samples, so raising num_samples reruns no done block (and, below it, no done shard).
# Each block streams the whole dataset once: 64 shards of work per scan.
SELECTION_BLOCK_SHARDS = 64

PROMPT_SCHEMA = {
    "id": pl.String,
    "source": pl.String,
    "row": pl.Int64,
    "turn": pl.Int32,
    "system": pl.String,
    "question": pl.String,
    "original_answer": pl.String,
}
SKIPPED_SCHEMA = {"row": pl.Int64, "source": pl.String, "reason": pl.String, "id": pl.String}

_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}


class DatasetError(ValueError):
    """The dataset as a whole cannot be read (a missing path, an unknown format)."""


class RowError(ValueError):
    """One row is damaged; the message is the reason kept in skipped.parquet."""


@dataclass(frozen=True)
class Prompt:
    """One independent question: a human turn with the row's system turn, if any."""

    id: str
    source: str
    row: int
    turn: int
    system: str | None
    question: str
    original_answer: str | None


# --- reading ----------------------------------------------------------------------------------------


def _parquet_files(path: str) -> list[str]:
    if path.startswith("hf://"):
        return [path.rstrip("/") + "/**/*.parquet" if not path.endswith(".parquet") else path]
    p = Path(path)
    if p.is_dir():
        files = sorted(str(f) for f in p.rglob("*.parquet"))
        if not files:
            raise DatasetError(f"dataset.path {path!r} is a folder without .parquet files")
        return files
    return [path]


def iter_rows(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """Yield (row index, row) over the whole dataset; a jsonl line that is not JSON yields a RowError.

    Args:
        path: a .jsonl/.json file, a .parquet file, a folder of parquet files or an hf:// path.
    """
    path = str(path)
    if "://" not in path and not Path(path).exists():
        raise DatasetError(f"dataset.path {path!r} does not exist")
    if path.endswith((".jsonl", ".json")) and "://" not in path:
        yield from _iter_jsonl(Path(path))
        return
    if not (path.endswith(".parquet") or "://" in path or Path(path).is_dir()):
        raise DatasetError(f"dataset.path {path!r}: expected .jsonl, .parquet, a folder or hf://")
    index = 0
    for file in _parquet_files(path):
        for batch in pl.scan_parquet(file).collect_batches():
            for row in batch.iter_rows(named=True):
                yield index, row
                index += 1


def _iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open("rb") as f:
        index = 0
        for line in f:
            if not line.strip():
                continue
            try:
                yield index, json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                yield index, RowError(f"not valid JSON: {exc.msg if hasattr(exc, 'msg') else exc}")
            index += 1


# --- one row ------------------------------------------------------------------------------------------


def _turns(row: Any) -> list[tuple[str, str]]:
    """The row's messages as (role, text) with role in user|assistant|system; RowError when damaged."""
    if isinstance(row, RowError):
        raise row
    if not isinstance(row, dict):
        raise RowError(f"row is a {type(row).__name__}, not an object")
    turns = row.get("conversations")
    if turns is None:
        turns = row.get("messages")
    if turns is None:
        raise RowError("no 'conversations' or 'messages' field")
    if not isinstance(turns, list):
        raise RowError(f"'conversations' is a {type(turns).__name__}, not a list")
    return [_turn(i, t) for i, t in enumerate(turns)]


def _turn(index: int, turn: Any) -> tuple[str, str]:
    if not isinstance(turn, dict):
        raise RowError(f"turn {index} is a {type(turn).__name__}, not an object")
    role = turn.get("from") if turn.get("from") is not None else turn.get("role")
    text = turn.get("value") if turn.get("value") is not None else turn.get("content")
    if not isinstance(role, str) or role.lower() not in _ROLES:
        raise RowError(f"turn {index} has unknown role {role!r}")
    if not isinstance(text, str):
        raise RowError(f"turn {index} ({role}) value is {type(text).__name__}, not a string")
    return _ROLES[role.lower()], text


def _row_hash(source: str, turns: list[tuple[str, str]]) -> str:
    canonical = json.dumps({"source": source, "messages": turns}, ensure_ascii=False, separators=(",", ":"))
    return hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()


def prompt_id(row_hash: str, turn: int) -> str:
    """The stable id of a question: the row content's hash and the turn index, hashed again."""
    return hashlib.blake2b(f"{row_hash}:{turn}".encode(), digest_size=10).hexdigest()


def row_prompts(index: int, row: Any, turns_mode: str = "first") -> list[Prompt]:
    """The questions of one dataset row (the first human turn, or every one with turns_mode 'all').

    Raises:
        RowError: the row is damaged; the message is the reason.
    """
    turns = _turns(row)
    source = row.get("source") if isinstance(row.get("source"), str) else ""
    system = next((text for role, text in turns if role == "system"), None)
    row_hash = _row_hash(source, turns)
    prompts = []
    for position, (role, text) in enumerate(turns):
        if role != "user":
            continue
        if not text.strip():
            if not prompts and turns_mode == "first":
                raise RowError(f"turn {position} (human) is empty")
            continue
        answer = turns[position + 1][1] if position + 1 < len(turns) else None
        if position + 1 < len(turns) and turns[position + 1][0] != "assistant":
            answer = None
        prompts.append(
            Prompt(prompt_id(row_hash, position), source, index, position, system or None, text, answer)
        )
        if turns_mode == "first":
            break
    if not prompts:
        raise RowError("no non-empty human turn")
    return prompts


# --- selection and shards --------------------------------------------------------------------------


def _order_key(prompt_id_: str, seed: int) -> str:
    return hashlib.blake2b(f"{seed}:{prompt_id_}".encode(), digest_size=16).hexdigest()


@dataclass
class Selection:
    """The selected questions (in selection order), the skipped rows and the usable-question count."""

    selected: list[Prompt]
    skipped: list[dict[str, Any]]
    usable: int


def select(path: str, turns_mode: str, num_samples: int, seed: int) -> Selection:
    """Stream the dataset and keep the num_samples questions first in hash(seed, id) order.

    The order is a prefix, stable as num_samples grows. Memory is a bounded heap of num_samples
    questions plus one small entry per distinct id (for de-duplication), not the whole dataset.
    """
    heap: list[tuple[str, int, Prompt]] = []  # (negated order key, tie, prompt): a max-heap on the key
    first_row: dict[str, int] = {}
    skipped: list[dict[str, Any]] = []
    for index, row in iter_rows(path):
        source = row.get("source") if isinstance(row, dict) and isinstance(row.get("source"), str) else None
        try:
            found = row_prompts(index, row, turns_mode)
        except RowError as exc:
            skipped.append({"row": index, "source": source, "reason": str(exc), "id": None})
            continue
        for prompt in found:
            if prompt.id in first_row:
                reason = f"duplicate of row {first_row[prompt.id]}"
                skipped.append({"row": index, "source": source, "reason": reason, "id": prompt.id})
                continue
            first_row[prompt.id] = index
            entry = (_Desc(_order_key(prompt.id, seed)), len(first_row), prompt)
            if len(heap) < num_samples:
                heapq.heappush(heap, entry)
            elif entry[0].key < heap[0][0].key:
                heapq.heapreplace(heap, entry)
    selected = [prompt for _, _, prompt in sorted(heap, key=lambda e: e[0].key)]
    return Selection(selected, skipped, len(first_row))


class _Desc:
    """An order key compared in reverse, so that heapq's min-heap keeps the largest key on top."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def __lt__(self, other: _Desc) -> bool:
        return self.key > other.key


def selection_frame(selected: list[Prompt]) -> pl.DataFrame:
    """The selected questions as a table with PROMPT_SCHEMA's columns, in selection order."""
    columns = {name: [getattr(p, name) for p in selected] for name in PROMPT_SCHEMA}
    return pl.DataFrame(columns, schema=PROMPT_SCHEMA)


def write_parquet(
    frame: pl.DataFrame, path: str | os.PathLike[str], row_group_size: int | None = None
) -> None:
    """Write deterministically (same content, same bytes) and atomically (tmp + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    frame.write_parquet(tmp, compression="zstd", statistics=False, row_group_size=row_group_size)
    os.replace(tmp, path)


def selection_block_rows(block: int, shard_size: int) -> tuple[int, int]:
    """Questions [start, stop) of the selection order held by selection block `block`."""
    rows = SELECTION_BLOCK_SHARDS * shard_size
    return block * rows, (block + 1) * rows


def prepare_prompts(
    selection: dict[str, Any], num_samples: int, selection_path: str, skipped_path: str, start: int = 0
) -> dict[str, int]:
    """Read the dataset, select num_samples questions and write questions [start, num_samples) of the
    order, and the skipped rows.

    Args:
        selection: what the order depends on: the dataset `path`, `seed` and `turns`.
        num_samples: how many questions to take (fewer when the dataset has fewer).
        selection_path: prompts/selection-{b}.parquet; write_prompt_shard cuts the shards out of it.
        skipped_path: where the damaged and duplicate rows are listed with their reasons.
        start: the first question written (a block's first; 0 writes the whole selection).

    Returns:
        Counts: usable, skipped, selected.
    """
    found = select(selection["path"], selection.get("turns", "first"), num_samples, selection.get("seed", 0))
    selected, skipped = found.selected[start:], found.skipped
    write_parquet(selection_frame(selected), selection_path, row_group_size=SELECTION_ROW_GROUP)
    write_parquet(pl.DataFrame(skipped, schema=SKIPPED_SCHEMA), skipped_path)
    reasons = Counter(re.sub(r"\d+", "N", entry["reason"]) for entry in skipped)
    log.info("%d usable questions, %d rows skipped: %s", found.usable, len(skipped), dict(reasons))
    if len(found.selected) < num_samples:
        log.info(
            "dataset %s has %d usable questions, fewer than the %d this selection could hold",
            selection["path"],
            found.usable,
            num_samples,
        )
    log.info("selected %d questions", len(selected))
    return {"usable": found.usable, "skipped": len(skipped), "selected": len(selected)}


def write_prompt_shard(selection_path: str, start: int, stop: int, output: str) -> int:
    """Write rows [start, stop) of the selection as one prompt shard; return how many it holds.

    Fewer rows (or none) when the dataset had fewer usable questions than num_samples. Only the
    selection's row groups that overlap the range are read.
    """
    if not 0 <= start <= stop:
        raise ValueError(f"prompt shard rows [{start}, {stop}): start must be >= 0 and <= stop")
    try:
        frame = pl.scan_parquet(selection_path).slice(start, stop - start).collect()
    except (OSError, pl.exceptions.ComputeError) as error:
        raise DatasetError(
            f"{selection_path}: cannot read the selection ({error}); rerun prepare_prompts"
        ) from error
    if dict(frame.schema) != PROMPT_SCHEMA:
        raise DatasetError(
            f"{selection_path}: columns {dict(frame.schema)} are not the prompt schema; rerun prepare_prompts"
        )
    write_parquet(frame, output)
    if frame.height < stop - start:
        log.warning(
            "prompt shard %s holds %d questions, not %d: the dataset has fewer usable questions than "
            "dataset.num_samples",
            output,
            frame.height,
            stop - start,
        )
    log.info("prompt shard %s: rows %d-%d of the selection, %d questions", output, start, stop, frame.height)
    return frame.height
