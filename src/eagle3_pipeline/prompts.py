"""Questions from a chat dataset, with stable ids, in shards whose membership never changes.

Reads open-perfectblend's format (`conversations: [{from: human|gpt|system, value}]`, `source`) and
OpenAI/ShareGPT-style rows (`messages` or `conversations` of `{role, content}`), from a .jsonl, a
.json (a JSON array, or JSON lines), a .parquet, a folder of parquet files or an
`hf://datasets/ORG/NAME` path. A damaged row is never fatal: it is counted and its reason kept in the
skipped table (a text holding a lone UTF-16 surrogate escape, which no UTF-8 file can store, is
such a row). A dataset without a single usable question is an error naming its path.

A question's id hashes its normalised text and the row's system turn (Unicode NFC, whitespace runs
collapsed): the same question from two rows, two sources or with another answer is one prompt,
generated once, on one side of the train/validation split; the later copies are listed in
skipped.parquet with reason `duplicate` and the kept id. With generation.history `own` the unit is a
conversation: its id hashes the system turn and every human turn, and each turn's id that and the
turn's position, so that a conversation is generated once, in one shard, turn after turn.

The selection orders the units by `hash(seed, id)` and takes a prefix, written in blocks of
SELECTION_BLOCK_SHARDS shards (prompts/selection-{b:05d}.parquet holds questions [b * B, (b + 1) * B)
of the order, B = 64 x shard_size, whatever num_samples is); shard k is rows [k * shard_size,
(k + 1) * shard_size) of the order (planning/blocks.py). With history `own` every edge (a block's, a
shard's) moves forward to the next conversation start, so that no conversation is cut. Raising
num_samples adds blocks and shards and leaves every done block and full shard alone.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from eagle3_pipeline import io
from eagle3_pipeline.settings import DatasetSettings, QuestionOrder

log = logging.getLogger(__name__)

# Rows per row group of the selection: a shard job reads only the groups its rows fall in.
SELECTION_ROW_GROUP = 1024
# The selection's parquet metadata key saying that its units are whole conversations (history own).
UNITS_KEY = "eagle3_pipeline.units"
# With history own: how many questions of the order a block's file starts after the block's first
# (the end of a conversation that the previous block holds whole).
OFFSET_KEY = "eagle3_pipeline.offset"

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
    if path.endswith(".json") and "://" not in path and _starts_with(Path(path), b"["):
        yield from enumerate(_read_json_array(Path(path)))
        return
    if path.endswith((".jsonl", ".json")) and "://" not in path:
        yield from _iter_jsonl(Path(path))
        return
    if not (path.endswith(".parquet") or "://" in path or Path(path).is_dir()):
        raise DatasetError(f"dataset.path {path!r}: expected .jsonl, .json, .parquet, a folder or hf://")
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


def _starts_with(path: Path, prefix: bytes) -> bool:
    """Whether the file's first non-whitespace bytes (after a UTF-8 BOM) are `prefix`."""
    with path.open("rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf").lstrip()
    return head.startswith(prefix)


def _read_json_array(path: Path) -> list[Any]:
    """A .json file holding one JSON array of rows (read whole: such files are not streamed)."""
    try:
        rows = json.loads(path.read_bytes().decode("utf-8-sig"))
    except (ValueError, UnicodeDecodeError) as error:
        raise DatasetError(
            f"dataset.path {str(path)!r}: starts like a JSON array but is not one ({error})"
        ) from error
    if not isinstance(rows, list):
        raise DatasetError(f"dataset.path {str(path)!r}: expected a JSON array of rows")
    return rows


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
    if not _encodable(text):
        raise RowError(f"turn {index} ({role}) holds a lone surrogate escape (not valid Unicode text)")
    return _ROLES[role.lower()], text


def _encodable(text: str) -> bool:
    """False for a lone surrogate (json.loads accepts "\\ud800"; no UTF-8 file can store it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def normalise(text: str) -> str:
    """What two copies of one question share: Unicode NFC, whitespace runs as one space, stripped."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def _hash(*parts: Any, size: int = 10) -> str:
    canonical = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    return hashlib.blake2b(canonical.encode(), digest_size=size).hexdigest()


def prompt_id(system: str | None, question: str) -> str:
    """The stable id of a question sent alone: its normalised text and its system turn, hashed."""
    return _hash(normalise(system or ""), normalise(question))


def conversation_id(system: str | None, questions: list[str]) -> str:
    """The stable id of a conversation (history `own`): its system turn and every human turn."""
    return _hash("conversation", normalise(system or ""), [normalise(q) for q in questions])


def turn_id(conversation: str, position: int) -> str:
    """The id of one turn of a conversation: the conversation's id and the turn's position."""
    return _hash(conversation, position)


def row_prompts(index: int, row: Any, turns_mode: str = "first", history: str = "none") -> list[Prompt]:
    """The questions of one dataset row (the first human turn, or every one with turns_mode 'all').

    With history `own` the ids are the conversation's turn ids (see conversation_id).

    Raises:
        RowError: the row is damaged; the message is the reason.
    """
    turns = _turns(row)
    source = row.get("source") if isinstance(row.get("source"), str) else ""
    if not _encodable(source):
        raise RowError("source holds a lone surrogate escape (not valid Unicode text)")
    system = next((text for role, text in turns if role == "system"), None) or None
    found: list[tuple[int, str, str | None]] = []  # (position, question, the dataset's answer)
    for position, (role, text) in enumerate(turns):
        if role != "user":
            continue
        if not text.strip():
            if not found and turns_mode == "first":
                raise RowError(f"turn {position} (human) is empty")
            continue
        follows = position + 1 < len(turns) and turns[position + 1][0] == "assistant"
        found.append((position, text, turns[position + 1][1] if follows else None))
        if turns_mode == "first":
            break
    if not found:
        raise RowError("no non-empty human turn")
    if history == "own":
        conversation = conversation_id(system, [question for _, question, _ in found])
        ids = [turn_id(conversation, position) for position, _, _ in found]
    else:
        ids = [prompt_id(system, question) for _, question, _ in found]
    return [
        Prompt(id_, source, index, position, system, question, answer)
        for id_, (position, question, answer) in zip(ids, found, strict=True)
    ]


def unit_key(prompts: list[Prompt], history: str) -> str:
    """What a duplicate shares: the question's id, or with history `own` the conversation's id."""
    if history == "own":
        return conversation_id(prompts[0].system, [p.question for p in prompts])
    return prompts[0].id


# --- selection and shards --------------------------------------------------------------------------


def _order_key(key: str, seed: int) -> str:
    return hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=16).hexdigest()


@dataclass
class Selection:
    """The selected questions (in selection order), the skipped rows and the usable-question count."""

    selected: list[Prompt]
    skipped: list[dict[str, Any]]
    usable: int


def _units(prompts: list[Prompt], history: str) -> list[list[Prompt]]:
    """A row's questions as units: each alone, or with history `own` the whole conversation."""
    return [prompts] if history == "own" else [[p] for p in prompts]


def select(path: str, turns_mode: str, num_samples: int, seed: int, history: str = "none") -> Selection:
    """Stream the dataset and keep the units first in hash(seed, key) order, num_samples questions.

    The order is a prefix, stable as num_samples grows. With history `own` whole conversations are
    kept (the last one may take the count past num_samples). Memory is a bounded heap of the kept
    units plus one small entry per distinct key (for de-duplication), not the whole dataset.
    """
    heap: list[tuple[_Desc, int, list[Prompt]]] = []  # a max-heap on the order key
    held = 0  # questions in the heap
    seen: set[str] = set()
    usable = 0
    skipped: list[dict[str, Any]] = []
    for index, row in iter_rows(path):
        source = _source(row)
        try:
            units = _units(row_prompts(index, row, turns_mode, history), history)
        except RowError as exc:
            skipped.append({"row": index, "source": source, "reason": str(exc), "id": None})
            continue
        for unit in units:
            key = unit_key(unit, history)
            if key in seen:
                skipped.append({"row": index, "source": source, "reason": "duplicate", "id": unit[0].id})
                continue
            seen.add(key)
            usable += len(unit)
            order = _Desc(_order_key(key, seed))
            if held >= num_samples and (not heap or not order.key < heap[0][0].key):
                continue  # later in the order than everything kept
            heapq.heappush(heap, (order, len(seen), unit))
            held += len(unit)
            while heap and held - len(heap[0][2]) >= num_samples:
                held -= len(heapq.heappop(heap)[2])
    selected = [p for _, _, unit in sorted(heap, key=lambda e: e[0].key) for p in unit]
    return Selection(selected, skipped, usable)


def _source(row: Any) -> str | None:
    """The row's `source` when it is storable text, for the skipped table."""
    source = row.get("source") if isinstance(row, dict) else None
    return source if isinstance(source, str) and _encodable(source) else None


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
    frame: pl.DataFrame,
    path: str | os.PathLike[str],
    row_group_size: int | None = None,
    metadata: dict[str, str] | None = None,
) -> None:
    """Write deterministically (same content, same bytes: no statistics) and atomically."""
    io.write_parquet(
        frame, path, compression="zstd", statistics=False, row_group_size=row_group_size, metadata=metadata
    )


def prepare_prompts(
    dataset: DatasetSettings | QuestionOrder,
    history: str,
    num_samples: int,
    selection_path: str,
    skipped_path: str,
    start: int = 0,
) -> dict[str, int]:
    """Read the dataset, select num_samples questions and write questions [start, num_samples) of the
    order, and the skipped rows.

    Args:
        dataset: its `path`, `seed` and `turns`: what the order depends on, with `history`
            (its num_samples and shard_size are not read: the caller's rows are).
        history: generation.history (`own`: the units are whole conversations).
        num_samples: how many questions to take (fewer when the dataset has fewer).
        selection_path: prompts/selection-{b}.parquet; write_prompt_shard cuts the shards out of it.
        skipped_path: where the damaged and duplicate rows are listed with their reasons.
        start: the first question written (a block's first; 0 writes the whole selection).

    Returns:
        Counts: usable, skipped, selected.

    Raises:
        DatasetError: the dataset cannot be read, or holds no usable question.
    """
    path = dataset.path
    found = select(path, dataset.turns, num_samples, dataset.seed, history)
    first = start
    metadata = None  # write_prompt_shard reads the unit from here: its params stay as before history
    if history == "own":
        first = conversation_start(selection_frame(found.selected)["row"], start)
        metadata = {UNITS_KEY: "conversations", OFFSET_KEY: str(first - start)}
    selected, skipped = found.selected[first:], found.skipped
    reasons = Counter(re.sub(r"\d+", "N", entry["reason"]) for entry in skipped)
    if not found.usable:
        raise DatasetError(
            f"dataset.path {path!r} holds no usable question ({len(skipped)} rows skipped: "
            f"{dict(reasons.most_common(5))}); point dataset.path at a chat dataset"
        )
    write_parquet(selection_frame(selected), selection_path, SELECTION_ROW_GROUP, metadata)
    write_parquet(pl.DataFrame(skipped, schema=SKIPPED_SCHEMA), skipped_path)
    log.info("%d usable questions, %d rows skipped: %s", found.usable, len(skipped), dict(reasons))
    if len(found.selected) < num_samples:
        log.info(
            "dataset %s has %d usable questions, fewer than the %d this selection could hold",
            path,
            found.usable,
            num_samples,
        )
    log.info("selected %d questions", len(selected))
    return {"usable": found.usable, "skipped": len(skipped), "selected": len(selected)}


def conversation_start(rows: pl.Series, index: int) -> int:
    """The first selection row at or after `index` that starts a conversation (a new dataset row)."""
    while 0 < index < len(rows) and rows[index] == rows[index - 1]:
        index += 1
    return min(index, len(rows))


def write_prompt_shard(selection_path: str, start: int, stop: int, output: str) -> int:
    """Write rows [start, stop) of the selection as one prompt shard; return how many it holds.

    Fewer rows (or none) when the dataset had fewer usable questions than num_samples. Only the
    selection's row groups that overlap the range are read. When the selection's units are whole
    conversations (history `own`, in its metadata), both ends move forward to the next conversation
    start, so that no conversation is cut.
    """
    if not 0 <= start <= stop:
        raise ValueError(f"prompt shard rows [{start}, {stop}): start must be >= 0 and <= stop")
    try:
        metadata = pl.read_parquet_metadata(selection_path)
        if metadata.get(UNITS_KEY) == "conversations":
            rows = pl.read_parquet(selection_path, columns=["row"])["row"]
            offset = int(metadata.get(OFFSET_KEY, 0))  # the block's file starts that far in
            start = conversation_start(rows, max(start - offset, 0))
            stop = conversation_start(rows, max(stop - offset, 0))
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
