"""The hidden-state disk budget: how many bytes extraction will write, checked against free space.

Each token costs bytes_per_token (state_bytes.py: 4 x H values in the storage dtype, its id and its
mask). Two estimates:

- from the config, before anything ran (`python -m eagle3_pipeline.budget CONFIG`): every sample as
  long as its prompt plus `generation.max_tokens`, capped at `hidden_states.max_seq_len` (an upper
  bound: most replies stop earlier);
- from the traces of one shard, once it is generated (rule check_disk_budget, per shard): the real
  sequence lengths.

`check_free_space` fails early, with the numbers, when the results filesystem cannot hold them. What
must fit at once is the whole estimate, or under `hidden_states.max_disk_gb` what the cap's plan
holds at once (`on_disk_at_once`: one window or one pass of shards, their parts being packed and the
training state files; the plan itself is planning/disk_cap.py's), which the command and the run's
first lines print.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline import io
from eagle3_pipeline.logs import setup_logging
from eagle3_pipeline.planning.disk_cap import config_plan, parse_time_hidden_size, window_plan
from eagle3_pipeline.planning.window_plan import WindowPlan
from eagle3_pipeline.settings import Settings
from eagle3_pipeline.state_bytes import GB, DiskBudgetError, bytes_per_token, format_bytes
from eagle3_pipeline.target_shape import TargetShape

logger = logging.getLogger(__name__)

DEFAULT_PROMPT_TOKENS = 512  # a typical open-perfectblend prompt once templated
DEFAULT_HEADROOM = 0.05  # keep 5% of the estimate free on top, for metadata and partial shards
REPO_ROOT = Path(__file__).resolve().parents[2]


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
    plan = plan or config_plan(settings, budget.hidden_size)
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
    plan = plan or config_plan(settings, budget.hidden_size)
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
