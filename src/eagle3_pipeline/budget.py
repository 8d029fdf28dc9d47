"""The hidden-state disk budget: how many bytes extraction will write, checked against free space.

Per token, extraction stores three auxiliary hidden states and the final one (4 x H values in the
storage dtype) plus the input id (int64) and the loss mask (one byte):

    bytes = tokens x (4 x H x itemsize + 9)

For Kimi-K2.5 (H = 7168, bf16) that is 57,353 bytes a token: about 470 MB for one 8k-token sample.

Two estimates:

- from the config, before anything ran (`python -m eagle3_pipeline.budget CONFIG`): every sample as
  long as its prompt plus `generation.max_tokens`, capped at `hidden_states.max_seq_len` (an upper
  bound: most replies stop earlier);
- from the traces of one shard, once it is generated (rule check_disk_budget, per shard): the real
  sequence lengths.

`check_free_space` fails early, with the numbers, when the results filesystem cannot hold them.

With `hidden_states.max_disk_gb` (a cap on the states held on disk at once) the plan is a WindowPlan:
when every shard fits the cap at once, one extraction pass whose states stay for every epoch (as
uncapped); else per epoch windows of shards whose states are extracted, trained on and deleted, so
the disk holds at most one window, whatever the corpus size. A shard counts its states once (its
parts are moved into its packed file one at a time, each deleted once written); on top, one batch part
for each shard that may be packing at once: at most hidden_states.pack_slots of them, whatever the
window's size (hidden_states/packing.pack_slot: a shard's packing holds one of the run's pack slots),
so a window reserves min(pack_slots, its shards) parts (pack_reserve). A shard's states are its traces'
real bytes where its check_disk_budget record is up to date (traced_states: read when the workflow is
parsed), else its upper bound from the config (every sample as long as max_seq_len), so the cap is
never exceeded; a cap smaller than one shard's bound (plus a part) is refused. The cap also holds
the training state files that training keeps (STATE_FILES_AT_ONCE: the previous window's and the
current one's, draft/train.py; two for each draft trained, a validate.learning_curve point being one:
state_files_at_once), each the draft's trained fp32 weights and AdamW's two fp32 moments
(`state_file_bytes`: 14.3 GB for the Kimi-K2.5 example's draft, a Llama draft of SpecForge's shape
since it sets draft.head_dim; 10.8 GB for the MLA draft `draft.architecture: auto` gives that target
without a head size).
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import logging
import math
import random
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline import io
from eagle3_pipeline.logs import setup_logging
from eagle3_pipeline.settings import DRAFT_ATTENTION_KEYS, DraftSettings, Settings
from eagle3_pipeline.target_shape import TargetShape

logger = logging.getLogger(__name__)

STATE_COUNT = 4  # three auxiliary layers + the final hidden state
TOKEN_OVERHEAD_BYTES = 9  # input id (int64) + loss mask (uint8)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
DEFAULT_PROMPT_TOKENS = 512  # a typical open-perfectblend prompt once templated
DEFAULT_HEADROOM = 0.05  # keep 5% of the estimate free on top, for metadata and partial shards
GB = 1000**3  # hidden_states.max_disk_gb counts in powers of 1000, as disks are sold
STATE_FILES_AT_ONCE = 2  # per draft trained: the previous window's state file and the current one's
STATE_BYTES_PER_PARAMETER = 12  # fp32 weights + AdamW's exp_avg and exp_avg_sq (fp32)
STATE_FILE_OVERHEAD = 10**6  # schedule, position, history: well under a megabyte
REPO_ROOT = Path(__file__).resolve().parents[2]


class DiskBudgetError(RuntimeError):
    """The results filesystem cannot hold the hidden states; the message gives the numbers and fixes."""


def drafts_trained(settings: Settings) -> int:
    """Drafts trained on the main draft's states, each with its own training state files: the main
    draft and every validate.learning_curve point trained apart (the point of every shard is the main
    draft itself; validate/learning_curve.py). Under a cap they train on the same windows."""
    from eagle3_pipeline.config import shard_ids
    from eagle3_pipeline.planning.variants import Variants

    shards = shard_ids(settings.dataset.num_samples, settings.dataset.shard_size)
    return 1 + len(Variants.from_settings(settings, shards, "").curve)


def _drafts_note(settings: Settings) -> str:
    """Why there are more than STATE_FILES_AT_ONCE state files, in a few words ("" when there are not)."""
    points = drafts_trained(settings) - 1
    if not points:
        return ""
    return (
        f" ({STATE_FILES_AT_ONCE} for each of {points + 1} drafts: the main draft and {points} "
        f"validate.learning_curve point{'s' if points > 1 else ''})"
    )


def state_files_at_once(settings: Settings) -> int:
    """Training state files on disk at once: STATE_FILES_AT_ONCE for each draft trained (drafts_trained)."""
    return STATE_FILES_AT_ONCE * drafts_trained(settings)


@dataclass(frozen=True)
class Budget:
    """An estimate of the hidden-state bytes of a run."""

    source: str  # "config" (upper bound before generation) or "traces" (real lengths)
    samples: int
    tokens: int
    hidden_size: int
    dtype: str
    bytes_per_token: int
    total_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "total": format_bytes(self.total_bytes)}


def bytes_per_token(hidden_size: int, dtype: str = "bfloat16") -> int:
    """Bytes one token costs on disk: 4 hidden states of `hidden_size` values, its id and its mask."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown hidden_states.dtype {dtype!r}; use one of {sorted(DTYPE_BYTES)}")
    return STATE_COUNT * hidden_size * DTYPE_BYTES[dtype] + TOKEN_OVERHEAD_BYTES


def format_bytes(count: float) -> str:
    """Human-readable size in powers of 1000 (as disks are sold): '1.23 TB'."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.2f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


def _budget(source: str, samples: int, tokens: int, hidden_size: int, dtype: str) -> Budget:
    per_token = bytes_per_token(hidden_size, dtype)
    return Budget(source, samples, tokens, hidden_size, dtype, per_token, tokens * per_token)


def estimate_from_settings(
    settings: Settings, hidden_size: int, prompt_tokens: int = DEFAULT_PROMPT_TOKENS
) -> Budget:
    """Upper bound before the run: num_samples x min(prompt + max_tokens, max_seq_len) tokens."""
    samples = settings.dataset.num_samples
    per_sample = min(prompt_tokens + settings.generation.max_tokens, settings.hidden_states.max_seq_len)
    return _budget("config", samples, samples * per_sample, hidden_size, settings.hidden_states.dtype)


def shard_bound_bytes(settings: Settings, hidden_size: int) -> int:
    """The most one shard's states can take: shard_size samples x max_seq_len tokens x bytes per token."""
    hs = settings.hidden_states
    return settings.dataset.shard_size * hs.max_seq_len * bytes_per_token(hidden_size, hs.dtype)


def part_bound_bytes(settings: Settings, hidden_size: int) -> int:
    """The most one batch's part takes (a batch holds up to batch_tokens, or one longer sequence)."""
    hs = settings.hidden_states
    return max(hs.batch_tokens, hs.max_seq_len) * bytes_per_token(hidden_size, hs.dtype)


def shard_peak_bytes(settings: Settings, hidden_size: int) -> int:
    """The most one shard takes on disk while it is extracted: its states once (the parts are moved
    into the packed file one at a time, each deleted once written: hidden_states/packing.py), plus the
    part being moved. A window of many shards reserves that part for at most hidden_states.pack_slots
    of them (pack_reserve)."""
    bound = shard_bound_bytes(settings, hidden_size)
    return bound + min(part_bound_bytes(settings, hidden_size), bound)


def state_file_bytes(draft: DraftSettings, model_config: Mapping[str, Any]) -> int:
    """Bytes of one training state file for the draft (config draft.*) of the target whose parsed
    config.json is `model_config`: STATE_BYTES_PER_PARAMETER per trained parameter, plus
    STATE_FILE_OVERHEAD (the frozen embeddings are not in it: draft/train.py)."""
    from eagle3_pipeline.draft.config import NUM_AUX_LAYERS, draft_config_from_target

    shape = {k: getattr(draft, k) for k in DRAFT_ATTENTION_KEYS}
    c = draft_config_from_target(
        dict(model_config), draft.draft_vocab_size, **shape, architecture=draft.architecture
    )
    h = c.hidden_size
    parameters = NUM_AUX_LAYERS * c.target_hidden_size * h  # fc
    parameters += _attention_parameters(c)
    parameters += 3 * h * c.intermediate_size + c.draft_vocab_size * h + 4 * h  # MLP, lm_head, 4 norms
    return STATE_BYTES_PER_PARAMETER * parameters + STATE_FILE_OVERHEAD


def _attention_parameters(c: Any) -> int:
    """Trained parameters of the draft's attention (a DraftConfig `c`), whose inputs are 2H wide:
    Llama's q/k/v and o (draft/model.py), or MLA's q LoRA (or q), the latent kv with its rope part,
    their norms, kv_b and o (draft/mla.py)."""
    h = c.hidden_size
    if c.architecture != "deepseek_mla":
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        return 2 * h * (q + 2 * kv) + q * h
    heads, rq, rkv = c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank
    q_width = heads * (c.qk_nope_head_dim + c.qk_rope_head_dim)
    q = 2 * h * rq + rq + rq * q_width if rq else 2 * h * q_width
    kv = 2 * h * (rkv + c.qk_rope_head_dim) + rkv + rkv * heads * (c.qk_nope_head_dim + c.v_head_dim)
    return q + kv + heads * c.v_head_dim * h


def parse_time_state_bytes(settings: Settings, hidden_size: int) -> int:
    """One training state file's bytes when the workflow is parsed: from the target's config.json, the
    demo's shape, or (no weights yet) an upper bound from the hidden size (an MLP 4 x hidden wide)."""
    from eagle3_pipeline.demo import DEMO_TARGET_SHAPE

    path = Path(settings.target.model) / "config.json"
    if path.exists():
        model_config = TargetShape.load(path).text
        try:
            return state_file_bytes(settings.draft, model_config)
        except (KeyError, TypeError, ValueError):  # not a shape the draft reads: the bound below
            pass
    elif settings.demo.enabled:
        return state_file_bytes(settings.draft, DEMO_TARGET_SHAPE)
    bound = {"hidden_size": hidden_size, "num_attention_heads": max(1, hidden_size // 128)}
    bound["intermediate_size"] = 4 * hidden_size
    bound["vocab_size"] = settings.draft.draft_vocab_size
    return state_file_bytes(settings.draft, bound)


def shards_per_window(settings: Settings, hidden_size: int, state_bytes: int = 0) -> int | None:
    """Shards per training window under hidden_states.max_disk_gb (None: no cap, no windows).

    Decided from the config alone, at parse time: the most shards n with n x B + min(K, n) x P <=
    cap - 2S, B one shard's upper bound, P one batch's part (at most B), K hidden_states.pack_slots
    (shards packing at once) and S one training state file (`state_bytes`; 2S: STATE_FILES_AT_ONCE of
    them, for each draft trained, state_files_at_once): floor((cap - 2S - K x P) / B) when that is at
    least K, else floor((cap - 2S) / (B + P)). A
    shard is counted once: its parts are moved into the packed file one at a time and each deleted once
    written (shard_peak_bytes); every shard of a window may be extracted at the same time, at most K
    of them packing (hidden_states/packing.pack_slot).

    Raises:
        DiskBudgetError: the cap cannot hold one window of one shard; the message gives the numbers.
    """
    hs = settings.hidden_states
    cap_gb = hs.max_disk_gb
    if cap_gb is None:
        return None
    bound = shard_bound_bytes(settings, hidden_size)
    peak = shard_peak_bytes(settings, hidden_size)
    files = state_files_at_once(settings)
    states = files * state_bytes
    room = max(0, cap_gb * GB - states)
    slots = hs.pack_slots
    shards = int(max(0, room - slots * (peak - bound)) // bound)
    if shards < slots:  # fewer shards than pack slots: each of them may be packing at once
        shards = int(room // peak)
    if shards < 1:
        held = (
            f" plus {files} training state files of {format_bytes(state_bytes)}{_drafts_note(settings)}"
            if state_bytes
            else ""
        )
        raise DiskBudgetError(
            f"hidden_states.max_disk_gb: {cap_gb} GB ({format_bytes(cap_gb * GB)}) cannot hold one shard's "
            f"hidden states while it is extracted{held}: one shard is at most dataset.shard_size "
            f"{settings.dataset.shard_size:,} samples x hidden_states.max_seq_len {hs.max_seq_len:,} "
            f"tokens x {bytes_per_token(hidden_size, hs.dtype):,} B/token (4 states x hidden size "
            f"{hidden_size:,} x {hs.dtype} + id/mask) = {format_bytes(bound)}, plus the batch part being "
            f"packed while it is extracted: {format_bytes(peak)}. Raise max_disk_gb to at least "
            f"{math.ceil((peak + states) / GB * 1000) / 1000:g} (rounded up), or lower "
            "dataset.shard_size or hidden_states.max_seq_len."
        )
    return shards


def parse_time_hidden_size(
    settings: Settings, needed_for: str = "hidden_states.max_disk_gb (its training windows)"
) -> int:
    """The target's hidden size for planning (a parsed workflow, the budget and cost commands): from
    target.model's config.json when it is on this machine, else the config's target.hidden_size (where
    the weights are not), else, for the embedded demo whose target a rule builds later, the demo's.

    Raises:
        DiskBudgetError: none of them is available; the message names `needed_for`, the config key and
        the file looked for. Also when target.hidden_size and the config.json disagree.
    """
    from eagle3_pipeline.demo import DEMO_HIDDEN_SIZE

    path = Path(settings.target.model) / "config.json"
    stated = settings.target.hidden_size
    if path.exists():
        found = TargetShape.load(path).hidden_size
        if stated and stated != found:
            raise DiskBudgetError(
                f"target.hidden_size {stated} differs from {path}'s {found}: fix or remove target.hidden_size"
            )
        return found
    if stated:
        return int(stated)
    if settings.demo.enabled:
        return DEMO_HIDDEN_SIZE
    raise DiskBudgetError(
        f"{needed_for} needs the target's hidden size, but target.hidden_size is not set and {path} "
        "does not exist (the target's weights are not on this machine): set target.hidden_size in the "
        "config (the hidden_size in the target's config.json, or in its text_config), "
        "or point target.model at the target's weights folder"
    )


def tokens_from_lengths(
    lengths: Iterable[int], max_seq_len: int, overlong: str = "truncate"
) -> tuple[int, int]:
    """(samples, tokens) once each sequence is truncated to max_seq_len, or dropped when overlong=drop."""
    samples = tokens = 0
    for length in lengths:
        if length > max_seq_len and overlong == "drop":
            continue
        samples += 1
        tokens += min(length, max_seq_len)
    return samples, tokens


def trace_lengths(paths: Sequence[str | Path], fallback: int) -> list[int]:
    """Sequence length (prompt + completion tokens) of every trace row in the given parquet files.

    Token-id lists are counted when present; else the prompt_tokens/completion_tokens columns; a row
    with neither counts as `fallback` tokens (the conservative max_seq_len).
    """
    import polars as pl

    lengths: list[int] = []
    for path in paths:
        names = pl.scan_parquet(path).collect_schema().names()
        parts = [
            pl.col(ids).list.len() if ids in names else pl.col(count) if count in names else pl.lit(None)
            for ids, count in (
                ("prompt_token_ids", "prompt_tokens"),
                ("completion_token_ids", "completion_tokens"),
            )
        ]
        frame = pl.scan_parquet(path).select((parts[0] + parts[1]).fill_null(fallback).alias("n")).collect()
        lengths.extend(frame["n"].cast(pl.Int64).to_list())
    return lengths


def estimate_from_traces(
    paths: Sequence[str | Path], hidden_size: int, max_seq_len: int, overlong: str, dtype: str
) -> Budget:
    """The bytes extraction will write for these trace files, from their real lengths."""
    samples, tokens = tokens_from_lengths(trace_lengths(paths, max_seq_len), max_seq_len, overlong)
    return _budget("traces", samples, tokens, hidden_size, dtype)


def free_bytes(path: str | Path) -> int:
    """Free bytes on the filesystem that holds `path` (its nearest existing ancestor if not made yet)."""
    probe = Path(path).absolute()
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free


def existing_bytes(directory: str | Path) -> int:
    """Bytes of hidden-state shards already written (a resumed run needs only the rest)."""
    root = Path(directory)
    return sum(p.stat().st_size for p in root.rglob("*.safetensors")) if root.exists() else 0


def check_free_space(
    budget: Budget,
    results_dir: str | Path,
    already: int = 0,
    headroom: float = DEFAULT_HEADROOM,
    free: int | None = None,
) -> dict[str, Any]:
    """Compare what is still to write (+ headroom) with the free space; raise DiskBudgetError if short.

    Returns the figures (needed, free, ...) for the log.
    """
    free = free_bytes(results_dir) if free is None else free
    remaining = max(0, budget.total_bytes - already)
    needed = int(remaining * (1 + headroom))
    figures = {"estimate": budget.total_bytes, "already_written": already, "needed": needed, "free": free}
    if needed > free:
        raise DiskBudgetError(
            f"the hidden states need {format_bytes(needed)} ({budget.tokens:,} tokens x "
            f"{budget.bytes_per_token:,} B/token for {budget.samples:,} samples, {format_bytes(already)} "
            f"already written, {headroom:.0%} headroom) but {Path(results_dir).absolute()} has "
            f"{format_bytes(free)} free. Free space there, point results/ at a larger filesystem (a "
            "symlink), or lower dataset.num_samples / hidden_states.max_seq_len, or cap the states held at "
            "once (hidden_states.max_disk_gb)."
        )
    return figures


def describe(budget: Budget, figures: Mapping[str, int] | None = None) -> str:
    """A few lines for a person: what is stored, how much, and whether it fits."""
    lines = [
        f"hidden-state disk budget ({budget.source}): {budget.samples:,} samples, {budget.tokens:,} tokens",
        f"  per token: 4 states x {budget.hidden_size:,} x {budget.dtype} + id/mask = "
        f"{budget.bytes_per_token:,} B",
        f"  total: {format_bytes(budget.total_bytes)}",
    ]
    if figures:
        lines.append(
            f"  still to write (+headroom): {format_bytes(figures['needed'])}; "
            f"free: {format_bytes(figures['free'])}"
        )
    return "\n".join(lines)


def check_disk_budget(
    traces: Sequence[str | Path],
    target_config: str | Path,
    hidden_states_dir: str | Path,
    output: str | Path,
    max_seq_len: int,
    overlong: str = "truncate",
    dtype: str = "bfloat16",
    headroom: float = DEFAULT_HEADROOM,
    max_disk_gb: float | None = None,
) -> Budget:
    """The guard before one shard's extraction: its estimate from its traces, checked against the free
    space (and the cap); the estimate is written.

    The written JSON holds only the estimate (a function of the traces and settings), so re-checking
    unchanged traces rewrites an identical file and reruns nothing; free space goes to the log.

    Raises:
        DiskBudgetError: the shard's states do not fit the free space, or exceed hidden_states.max_disk_gb.
    """
    hidden_size = TargetShape.load(target_config).hidden_size
    budget = estimate_from_traces(traces, hidden_size, max_seq_len, overlong, dtype)
    if max_disk_gb is not None and budget.total_bytes > max_disk_gb * GB:
        raise DiskBudgetError(
            f"{', '.join(map(str, traces))}: this shard's hidden states need "
            f"{format_bytes(budget.total_bytes)} "
            f"({budget.tokens:,} tokens x {budget.bytes_per_token:,} B/token), more than "
            f"hidden_states.max_disk_gb = {max_disk_gb} GB: raise the cap or lower dataset.shard_size"
        )
    figures = check_free_space(budget, hidden_states_dir, 0, headroom)
    logger.info("%s", describe(budget, figures))
    # what it was made for too: a cap's plan sizes the shard from it (traced_states)
    io.write_json({**budget.to_json(), "max_seq_len": max_seq_len, "overlong": overlong}, output, indent=2)
    return budget


def held_at_once(settings: Settings, budget: Budget, plan: WindowPlan | None = None) -> tuple[Budget, str]:
    """`budget` reduced to what is on disk at once (on_disk_at_once), with why, for check_free_space."""
    peak, why = on_disk_at_once(settings, budget, plan)
    if peak == budget.total_bytes:
        return budget, why
    plan = plan or _config_plan(settings, budget.hidden_size)
    samples = budget.samples
    if plan is not None and not plan.one_pass:
        samples = min(samples, plan.largest_window * settings.dataset.shard_size)
    held = dataclasses.replace(
        budget, samples=samples, tokens=peak // budget.bytes_per_token, total_bytes=peak
    )
    return held, why


def on_disk_at_once(settings: Settings, budget: Budget, plan: WindowPlan | None = None) -> tuple[int, str]:
    """(bytes, why): the most the hidden states take on disk at once for this estimate of the corpus.

    Uncapped, every shard stays: the whole estimate. Capped, the cap's plan (`plan`, else the one from
    the config alone): one pass holds every shard once plus a part each; windows one window at a time,
    at most its shards once plus a part each (never more than the estimate plus those parts); both
    plus the training state files held at once (state_files_at_once).
    """
    plan = plan or _config_plan(settings, budget.hidden_size)
    if plan is None:
        return budget.total_bytes, "every shard is kept (hidden_states.max_disk_gb: null)"
    # never more than this estimate of the corpus with a part for each shard that may be packing
    held = min(plan.held_bytes, budget.total_bytes + plan.reserve_bytes)
    slots = min(plan.sizing.pack_slots, plan.largest_window)
    why = (
        f"capped by hidden_states.max_disk_gb = {settings.hidden_states.max_disk_gb} GB: "
        f"{plan.describe()}; at most {format_bytes(plan.held_bytes)} "
        f"({'every shard' if plan.one_pass else 'a window'} once, plus a part for each of the "
        f"{slots} shard{'s' if slots != 1 else ''} packing at once: hidden_states.pack_slots) and "
        f"{plan.sizing.state_files} training state files of {format_bytes(plan.state_file_bytes)}"
    )
    return held + plan.sizing.state_files * plan.state_file_bytes, why


def epoch_order(seed: int, epoch: int, shards: Sequence[str]) -> list[str]:
    """The shards in the order of one epoch under a cap, seeded by (seed, epoch): a new order every
    epoch, so a shard meets other shards' samples in its batches from one epoch to the next."""
    order = list(shards)
    # a str seed is hashed with SHA-512 (random.seed, version 2): the same order on every machine
    random.Random(f"windows:{seed}:{epoch}").shuffle(order)
    return order


def pack_reserve(states: Iterable[int], part: int, slots: int) -> int:
    """What a window of shards of these `states` reserves on top of them for packing: at most `slots`
    of its shards pack at once (hidden_states/packing.pack_slot), each with one part in flight of at
    most min(part, its states); the largest `slots` of those (min(slots, shards) parts for equal ones)."""
    return sum(heapq.nlargest(max(int(slots), 1), (min(part, s) for s in states)))


def cut_windows(
    order: Sequence[str], states: Mapping[str, int], room: int, part: int = 0, slots: int = 1
) -> list[list[str]]:
    """Consecutive shards of `order` in windows whose states, with the window's pack_reserve (`part`,
    `slots`), take at most `room`: each window takes shards until the next would not fit (for equal
    shards: the most n with n x states + min(slots, n) x part <= room).

    Raises:
        DiskBudgetError: one shard alone (with its part) does not fit `room`.
    """
    slots = max(int(slots), 1)
    windows: list[list[str]] = []
    current: list[str] = []
    used = 0
    extras: list[int] = []  # a min-heap of the window's `slots` largest parts in flight
    for shard in order:
        size, extra = states[shard], min(part, states[shard])
        if size + extra > room:
            raise DiskBudgetError(
                f"shard {shard}: its hidden states take {format_bytes(size + extra)} while extracted, more "
                f"than the {format_bytes(room)} hidden_states.max_disk_gb leaves beside the training state "
                "files: raise the cap or lower dataset.shard_size"
            )
        reserve = sum(extras)
        grown = reserve + extra if len(extras) < slots else reserve + max(0, extra - extras[0])
        if current and used + size + grown > room:
            windows.append(current)
            current, used, extras = [], 0, []
        current.append(shard)
        used += size
        if len(extras) < slots:
            heapq.heappush(extras, extra)
        else:
            heapq.heappushpop(extras, extra)
    if current:
        windows.append(current)
    return windows


def sized_windows(
    seed: int,
    epochs: int,
    shards: Sequence[str],
    states: Mapping[str, int],
    room: int,
    part: int = 0,
    slots: int = 1,
) -> list[list[list[str]]] | None:
    """The windows of every epoch for shards of these `states` under `room` bytes, each window with its
    pack_reserve (`part`, `slots`; part 0: `states` are whole peaks): None when every shard fits at
    once (one extraction pass, the states kept for all epochs), else per epoch epoch_order cut by
    cut_windows, each window's shards sorted. The number of windows can differ between epochs when the
    shards differ in size."""
    if sum(states[k] for k in shards) + pack_reserve((states[k] for k in shards), part, slots) <= room:
        return None
    orders = [epoch_order(seed, e, shards) for e in range(epochs)]
    return [[sorted(w) for w in cut_windows(order, states, room, part, slots)] for order in orders]


@dataclass(frozen=True)
class WindowSizing:
    """What sizes the plan under hidden_states.max_disk_gb (window_sizing; plain values, so a rule can
    pass it to a job as params): the cap, one training state file, one shard's config bound, one
    batch's part, the epochs' seed and count, what a shard's check_disk_budget record must have been
    made for (hidden size, dtype, max_seq_len, overlong) to size it from its traces, and how many
    shards may pack at once (hidden_states.pack_slots: a window reserves a part for each), and the
    training state files on disk at once (state_files_at_once: 2 for each draft trained)."""

    cap_bytes: int
    state_file_bytes: int
    shard_bound: int
    part: int
    seed: int
    epochs: int
    hidden_size: int
    dtype: str
    max_seq_len: int
    overlong: str
    pack_slots: int = 1
    state_files: int = STATE_FILES_AT_ONCE

    def reserve(self, states: Iterable[int]) -> int:
        """What a window of shards of these states reserves for packing (pack_reserve)."""
        return pack_reserve(states, self.part, self.pack_slots)

    @property
    def room(self) -> int:
        """Bytes the hidden states may take at once: the cap less the training state files."""
        return self.cap_bytes - self.state_files * self.state_file_bytes

    def plan(
        self, shards: Sequence[str], states: Mapping[str, int] | None = None, source: str | None = None
    ) -> WindowPlan:
        """The plan for `shards`, each at its bytes in `states` where given (its traces), else at its
        config bound; `source` names where the sizes came from (default: traces, config or both)."""
        known = states or {}
        traced = sum(1 for k in shards if k in known)
        if source is None:
            source = "traces" if traced == len(shards) else "config" if not traced else "traces and config"
        sizes = {k: known.get(k, self.shard_bound) for k in shards}
        windows = sized_windows(self.seed, self.epochs, shards, sizes, self.room, self.part, self.pack_slots)
        return WindowPlan(source, list(shards), sizes, traced, windows, self)


@dataclass(frozen=True)
class WindowPlan:
    """How extraction fits hidden_states.max_disk_gb: one pass (`windows` None: every shard extracted
    once and kept for every epoch, as uncapped), or per epoch its windows of shard ids (extracted,
    trained on and deleted, once per epoch)."""

    source: str  # "config" (every shard at its bound), "traces" (their real bytes), "traces and config"
    shards: list[str]
    shard_bytes: Mapping[str, int]  # each shard's states (a window adds WindowSizing.reserve)
    traced: int  # shards sized from their traces
    windows: list[list[list[str]]] | None
    sizing: WindowSizing

    @property
    def room(self) -> int:
        """Bytes the states may take at once (the cap less the training state files)."""
        return self.sizing.room

    @property
    def state_file_bytes(self) -> int:
        return self.sizing.state_file_bytes

    @property
    def one_pass(self) -> bool:
        return self.windows is None

    @property
    def engine_scopes(self) -> int:
        """Extraction scopes (one engine job each under the vllm backend): 1, or every epoch's windows."""
        return 1 if self.windows is None else sum(len(windows) for windows in self.windows)

    @property
    def extraction_passes(self) -> int:
        """Passes over the corpus: 1, or one per epoch."""
        return 1 if self.windows is None else len(self.windows)

    @property
    def largest_window(self) -> int:
        """Shards in the largest window (every shard in one pass)."""
        if self.windows is None:
            return len(self.shards)
        return max(len(window) for windows in self.windows for window in windows)

    def _scopes(self) -> list[list[str]]:
        """The shards on disk together: every shard in one pass, else each window."""
        return [list(self.shards)] if self.windows is None else [w for ws in self.windows for w in ws]

    @property
    def held_bytes(self) -> int:
        """The most the states take at once: every shard's states in one pass, else the largest
        window's, with their parts in flight (WindowSizing.reserve: at most pack_slots shards pack)."""
        return max(
            sum(self.shard_bytes[k] for k in w) + self.sizing.reserve(self.shard_bytes[k] for k in w)
            for w in self._scopes()
        )

    @property
    def reserve_bytes(self) -> int:
        """The most any window (or the one pass) reserves for the parts being packed at once."""
        return max(self.sizing.reserve(self.shard_bytes[k] for k in w) for w in self._scopes())

    def describe(self) -> str:
        """One phrase: what the plan does and where its sizes came from."""
        sized = {
            "config": "each shard at its config bound",
            "traces": "each shard from its traces",
            "traces and config": f"{self.traced:,} of {len(self.shards):,} shards from their traces, "
            "the rest at their config bound",
        }.get(self.source, self.source)
        if self.windows is None:
            return f"every shard fits at once ({sized}): one extraction pass, its states kept for every epoch"
        counts = sorted({len(windows) for windows in self.windows})
        per_epoch = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        most = f"{self.largest_window:,} shard{'s' if self.largest_window != 1 else ''}"
        return (
            f"windows of at most {most} ({per_epoch} per epoch, {sized}) extracted, "
            f"trained on and deleted, once per epoch ({self.extraction_passes} extraction passes over the "
            "corpus)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "one_pass": self.one_pass,
            "engine_scopes": self.engine_scopes,
            "extraction_passes": self.extraction_passes,
            "shards": len(self.shards),
            "traced": self.traced,
            "largest_window": self.largest_window,
            "held_bytes": self.held_bytes,
            "pack_slots": self.sizing.pack_slots,
            "reserve_bytes": self.reserve_bytes,
            "room": self.room,
            "state_file_bytes": self.state_file_bytes,
            "state_files": self.sizing.state_files,
            "windows": self.windows,
        }


def window_sizing(settings: Settings, hidden_size: int) -> WindowSizing | None:
    """The cap's sizing from the config and the target's hidden size (None: no cap).

    Raises:
        DiskBudgetError: the cap cannot hold one shard at its config bound (shards_per_window' message).
    """
    hs = settings.hidden_states
    if hs.max_disk_gb is None:
        return None
    state = parse_time_state_bytes(settings, hidden_size)
    shards_per_window(settings, hidden_size, state)  # a cap below one shard's bound: refused, with numbers
    return WindowSizing(
        cap_bytes=math.floor(hs.max_disk_gb * GB),
        state_file_bytes=state,
        shard_bound=shard_bound_bytes(settings, hidden_size),
        part=part_bound_bytes(settings, hidden_size),
        seed=settings.train.seed,
        epochs=settings.train.epochs,
        hidden_size=hidden_size,
        dtype=hs.dtype,
        max_seq_len=hs.max_seq_len,
        overlong=hs.overlong,
        pack_slots=hs.pack_slots,
        state_files=state_files_at_once(settings),
    )


def budget_record(results: str | Path, shard: str) -> Path:
    """Shard `shard`'s check_disk_budget record (rules/budget.smk)."""
    return Path(results) / "budget" / "hidden_states" / f"shard-{shard}.json"


def traced_states(results: str | Path, shards: Sequence[str], sizing: WindowSizing) -> dict[str, int]:
    """Each shard's states' bytes from its traces, where its check_disk_budget record is up to date:
    newer than every split's trace file of the shard and made for the same hidden size and dtype (and,
    where the record names them, max_seq_len and overlong). Shards without one are left out (their
    config bound stands). Cheap enough for parse time: a stat per file and a small JSON per shard."""
    from eagle3_pipeline.config import SPLITS

    want = {
        "hidden_size": sizing.hidden_size,
        "dtype": sizing.dtype,
        "max_seq_len": sizing.max_seq_len,
        "overlong": sizing.overlong,
    }
    states = {}
    for shard in shards:
        record = budget_record(results, shard)
        traces = [Path(results) / "traces" / "shards" / split / f"shard-{shard}.parquet" for split in SPLITS]
        try:
            made = record.stat().st_mtime_ns
            if any(path.stat().st_mtime_ns > made for path in traces):
                continue
            data = json.loads(record.read_text())
            total = int(data["total_bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if all(data.get(key, value) == value for key, value in want.items()):
            states[shard] = total
    return states


def window_plan(
    settings: Settings, hidden_size: int, shards: Sequence[str], results: str | Path | None = None
) -> WindowPlan | None:
    """The plan under the cap (None: no cap): every shard at its config bound, or with `results` (the
    run's folder) each shard whose traces are checked at its real bytes (traced_states). This is what
    rules/common/windows.smk plans with when the workflow is parsed.

    Raises:
        DiskBudgetError: the cap cannot hold one shard at its config bound.
    """
    sizing = window_sizing(settings, hidden_size)
    if sizing is None:
        return None
    return sizing.plan(shards, traced_states(results, shards, sizing) if results is not None else None)


def _config_plan(settings: Settings, hidden_size: int) -> WindowPlan | None:
    from eagle3_pipeline.config import shard_ids

    dataset = settings.dataset
    return window_plan(settings, hidden_size, shard_ids(dataset.num_samples, dataset.shard_size))


def describe_windows(windows: Sequence[Sequence[Sequence[str]]] | None) -> str:
    """A plan's windows in a few words: one pass, or the windows and extraction passes."""
    if windows is None:
        return "one extraction pass (1 engine start)"
    scopes = sum(len(epoch) for epoch in windows)
    passes = len(windows)
    return f"{scopes} windows over {passes} epochs ({scopes} engine starts, {passes} extraction passes)"


def confirm_window_plan(
    planned: Sequence[Sequence[Sequence[str]]] | None, current: WindowPlan, hidden_states_dir: str | Path
) -> dict[str, Any]:
    """The check before a capped run's first extraction (rule check_window_plan): the plan the workflow
    was parsed with (`planned`: its windows, None for one pass) is the one the shards' checked traces
    give now (`current`), and no states of the other layout are on disk beside it; returns the plan's
    JSON.

    Raises:
        DiskBudgetError: the traces plan otherwise (the run was planned before they were checked:
            nothing was extracted under the cap yet, a rerun plans from them), or states of the other
            layout (hidden_states/{split}/ for windows, hidden_states/epoch-*/ for one pass) would
            sit uncounted beside the plan's.
    """
    planned = None if planned is None else [[list(w) for w in epoch] for epoch in planned]
    if planned != current.windows:
        raise DiskBudgetError(
            f"hidden_states.max_disk_gb: this run was planned, when the workflow was parsed, as "
            f"{describe_windows(planned)}, but the shards' checked traces now plan "
            f"{describe_windows(current.windows)} ({current.describe()}). Nothing has been extracted under "
            "the cap yet: run snakemake again, which plans from the traces (the windows are chosen when the "
            "workflow is parsed; docs/hidden_states.md)"
        )
    from eagle3_pipeline.config import SPLITS

    root = Path(hidden_states_dir)
    pattern = "epoch-*/{split}/*.safetensors" if current.one_pass else "{split}/*.safetensors"
    stray = sorted(p for split in SPLITS for p in root.glob(pattern.format(split=split)))
    if stray:
        layout = "in windows, per epoch" if current.one_pass else "in one pass"
        raise DiskBudgetError(
            f"hidden_states.max_disk_gb: {len(stray)} hidden-state files extracted {layout} by an earlier "
            f"plan are still under {root} (e.g. {stray[0]}), outside this plan ({current.describe()}) and "
            "not counted in the cap: delete them (the plan extracts what it needs again)"
        )
    return current.to_json()


def check_window_plan(
    planned: Sequence[Sequence[Sequence[str]]] | None,
    sizing: WindowSizing,
    shards: Sequence[str],
    results: str | Path,
    output: str | Path,
) -> WindowPlan:
    """Rule check_window_plan: the plan from every shard's checked traces (traced_states, as the
    workflow plans when parsed) confirmed against the one the run was parsed with (confirm_window_plan),
    and written to `output`.

    Raises:
        DiskBudgetError: see confirm_window_plan.
    """
    current = sizing.plan(shards, traced_states(results, shards, sizing))
    record = confirm_window_plan(planned, current, Path(results) / "hidden_states")
    logger.info("hidden_states.max_disk_gb: %s", current.describe())
    io.write_json(record, output, indent=1)
    return current


def budget_at_start(settings: Settings, run_dir: str | Path, plan: WindowPlan | None = None) -> str:
    """What a run prints as it starts: the config's upper bound against the free space, in a few lines;
    under a cap what the plan (`plan`: the one the workflow was parsed with) holds at once.

    Never raises: the real check is rule check_disk_budget, on the real lengths, before extraction.
    """
    target_json = Path(settings.target.model) / "config.json"
    try:
        hidden_size = TargetShape.load(target_json).hidden_size
    except (OSError, ValueError) as error:
        return (
            f"hidden-state disk budget: not estimated yet ({target_json}: {error}); "
            "check_disk_budget checks it before extraction"
        )
    budget = estimate_from_settings(settings, hidden_size)
    held, why = held_at_once(settings, budget, plan)
    peak = held.total_bytes
    try:
        figures = check_free_space(held, run_dir, existing_bytes(Path(run_dir) / "hidden_states"))
    except DiskBudgetError as error:
        return (
            f"{describe(budget)}\n  on disk at once: {format_bytes(peak)}, {why}\n  upper bound does not "
            f"fit: {error}\n  check_disk_budget checks each shard's real lengths before its extraction job"
        )
    return (
        describe(budget, figures)
        + f"\n  on disk at once: {format_bytes(peak)}, {why}"
        + "\n  (upper bound: every reply as long as generation.max_tokens)"
    )


def cli_hidden_size(settings: Settings, override: int | None, needed_for: str) -> int:
    """The budget and cost commands' hidden size: --hidden-size, else parse_time_hidden_size's (the
    target's config.json, target.hidden_size, the demo's); SystemExit naming the key and file if none."""
    if override:
        return override
    try:
        return parse_time_hidden_size(settings, needed_for)
    except DiskBudgetError as error:
        raise SystemExit(f"{error} (or pass --hidden-size)") from None


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m eagle3_pipeline.budget",
        description="Print the hidden-state disk budget of a config and check it against free space.",
    )
    parser.add_argument("config", help="the run's config file (e.g. config/examples/kimi-k2.5-8gpu.yaml)")
    parser.add_argument(
        "--hidden-size",
        type=int,
        default=None,
        help="the target's hidden size (default: its config.json's, else target.hidden_size)",
    )
    parser.add_argument(
        "--prompt-tokens", type=int, default=DEFAULT_PROMPT_TOKENS, help="expected prompt length"
    )
    parser.add_argument("--results", default="results", help="the results folder (its filesystem is checked)")
    parser.add_argument("--schema", default=str(REPO_ROOT / "config" / "schema.yaml"))
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: the config's upper bound, the traces' figure when generation already ran; 1 if it won't fit."""
    import yaml

    from eagle3_pipeline.config import SPLITS, check_config, shard_ids
    from eagle3_pipeline.settings import build_settings

    args = _parse(sys.argv[1:] if argv is None else argv)
    settings = build_settings(check_config(yaml.safe_load(Path(args.config).read_text()), args.schema))
    hidden_size = cli_hidden_size(settings, args.hidden_size, "the disk budget")
    run_dir = Path(args.results) / settings.run
    budget = estimate_from_settings(settings, hidden_size, args.prompt_tokens)
    hs, dataset = settings.hidden_states, settings.dataset
    shards = shard_ids(dataset.num_samples, dataset.shard_size)
    traces = sorted((run_dir / "traces" / "shards").glob("*/shard-*.parquet"))
    if len(traces) == len(SPLITS) * len(shards):
        budget = estimate_from_traces(traces, hidden_size, hs.max_seq_len, hs.overlong, hs.dtype)
    try:  # under a cap, the plan the workflow makes: shards whose traces are checked at their real bytes
        held, why = held_at_once(settings, budget, window_plan(settings, hidden_size, shards, run_dir))
    except DiskBudgetError as error:  # a cap below one shard
        sys.stdout.write(describe(budget) + f"\nREFUSED: {error}\n")
        return 1
    peak = held.total_bytes
    already = 0 if hs.max_disk_gb is not None else existing_bytes(run_dir / "hidden_states")
    try:
        figures = check_free_space(held, run_dir, already)
    except DiskBudgetError as error:
        sys.stdout.write(
            describe(budget) + f"\n  on disk at once: {format_bytes(peak)}, {why}\nDOES NOT FIT: {error}\n"
        )
        return 1
    sys.stdout.write(describe(budget, figures) + f"\n  on disk at once: {format_bytes(peak)}, {why}\nfits.\n")
    sys.stdout.write(json.dumps({**budget.to_json(), **figures, "on_disk_at_once": peak}) + "\n")
    return 0


if __name__ == "__main__":
    setup_logging(None, "budget")
    sys.exit(main())
