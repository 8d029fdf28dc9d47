"""The report's page of extraction engine starts: one row per engine start the run's files record.

Every engine job (rule serve_extraction_engine, one per scope: the run's stale shards, an epoch's window
under a disk cap, the baseline's traces) writes its stats into the results when it ends
(`hidden_states.engine.write_record`: `results/RUN/hidden_states/engine_stats/[epoch-E-window-W/]
START_ID.json`, `results/RUN/baseline/hidden_states/engine_stats/`). This page lists them: its scope,
when it started and how long it took to be ready, how it ended, the requests (one per extraction job),
tokens, the busy fraction over its ready time (time in engine steps / wall from the engine ready to the
last request done) and where the rest of that wall went, and the longest wait for a client's request.
Records of earlier runs stay (one file per start): a run that extracted new shards adds a row.
"""

from __future__ import annotations

import html
import json
import logging
from pathlib import Path
from typing import Any

from eagle3_pipeline import io

log = logging.getLogger(__name__)

PAGE = (
    "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Extraction engine</title><style>"
    "body{font-family:sans-serif;margin:1em}th,td{text-align:right;padding:.2em .6em}"
    "th:first-child,td:first-child{text-align:left}</style></head><body><h2>Extraction engine</h2>"
    "{body}</body></html>"
)
COLUMNS = (
    "scope", "start", "ready in s", "ended", "requests", "tokens", "busy s", "ready to last done s",
    "busy fraction", "engine empty s", "own loop s", "tail s", "before first request s",
    "longest wait for a request s",
)  # fmt: skip
DEFINITION = (
    "<p>Busy fraction = time in engine steps / wall from the engine ready to the last request done (the "
    "time before it is ready, and after the last request, when no client has work, is not counted). The "
    "rest of that wall: the engine empty (waiting for a client's request), its own loop while requests "
    "were in it, the tail after its last step (the last parts written), and before the first request. "
    "One row per engine start (one per scope: the run's stale shards, an epoch's window under a disk "
    "cap, the baseline's traces), from <code>hidden_states/engine_stats/</code>.</p>"
)


def read_records(roots: list[str | Path], run_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Every engine start recorded under `roots` (START_ID.json, any depth), oldest first, each with its
    `scope`: the folder it was found in, relative to `run_dir` (results/RUN) when given."""
    records = []
    for root in map(Path, roots):
        for path in sorted(root.rglob("*.json")) if root.is_dir() else []:
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                log.warning("engine stats %s unreadable: left out of the report", path)
                continue
            folder = path.parent
            if run_dir is not None and folder.is_relative_to(run_dir):
                folder = folder.relative_to(run_dir)
            records.append({**record, "scope": str(folder)})
    return sorted(records, key=lambda r: str(r.get("start_id")))


def longest_wait(timeline: list[dict[str, Any]] | None) -> float | None:
    """The longest time the engine had no request to run: from one request done (or the engine ready)
    to the next one taken, when nothing was left in it (requests in order of their take)."""
    if not timeline:
        return None
    free_at, longest = 0.0, 0.0  # seconds from ready: when the engine last had nothing to run
    for entry in sorted(timeline, key=lambda e: e["taken_s"]):
        if entry["taken_s"] > free_at:
            longest = max(longest, entry["taken_s"] - free_at)
        free_at = max(free_at, entry["done_s"])
    return round(longest, 3)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}" if value < 10 else f"{value:.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def row(record: dict[str, Any]) -> list[Any]:
    """One table row (COLUMNS) of an engine start's record."""
    idle = record.get("idle_s") or {}
    return [
        record.get("scope"),
        record.get("start_id"),
        record.get("engine_start_s"),
        record.get("how") or record.get("stopped"),
        record.get("requests"),
        record.get("tokens"),
        record.get("busy_s"),
        record.get("ready_to_done_s"),
        record.get("busy_fraction"),
        idle.get("engine_empty"),
        idle.get("loop"),
        idle.get("tail"),
        idle.get("before_first_request"),
        longest_wait(record.get("timeline")),
    ]


def summary_line(records: list[dict[str, Any]]) -> str:
    """One sentence: engine starts, and the busy fraction over the ready time of all of them together."""
    if not records:
        return "No extraction engine start is recorded (hidden_states.backend: transformers, or none ran)."
    busy = sum(r.get("busy_s") or 0.0 for r in records)
    ready = sum(r.get("ready_to_done_s") or 0.0 for r in records)
    together = f"{busy / ready:.2f}" if ready > 0 else "not measured"
    return (
        f"{len(records)} extraction engine start(s) recorded; busy {busy:.1f} s of {ready:.1f} s from ready "
        f"to the last request done: busy fraction {together} over all of them."
    )


def engine_table(records: list[dict[str, Any]]) -> str:
    """The HTML table: COLUMNS, one row per engine start."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row(r)) + "</tr>" for r in records
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def engine_page(roots: list[str | Path], output: str | Path, run_dir: str | Path | None = None) -> None:
    """Rule plot_validation: the report's page of engine starts (engine.html) from the run's records."""
    records = read_records(roots, run_dir)
    body = f"<p>{html.escape(summary_line(records))}</p>" + DEFINITION
    if records:
        body += engine_table(records)
    io.write_text(PAGE.replace("{body}", body), output)
