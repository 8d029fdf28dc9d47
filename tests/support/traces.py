"""Synthetic generation shards with exactly the schema `generate_shard` writes.

Used by tests/unit/test_traces.py (as fixtures, registered in tests/conftest.py) and by
benchmarks/merge.py. Rows are built column-wise with numpy, so a million rows take seconds.
Every text is derived from the row number, so two shards never share an id unless asked to.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from eagle3_pipeline.traces.schema import GENERATION_SCHEMA

SOURCES = ("gsm8k", "code_alpaca", "open_hermes", "ultrachat")
IDENTITY = "1f0c5e7d2b9a4c83"


def _ids(rows: np.ndarray) -> list[str]:
    # like the prompts stage: a hash of the source row's content, independent of sharding
    return [hashlib.sha256(f"row-{r}".encode()).hexdigest()[:16] for r in rows.tolist()]


def _token_lists(rng: np.random.Generator, n: int, low: int, high: int) -> pl.Series:
    lengths = rng.integers(low, high + 1, size=n)
    frame = pl.DataFrame({"ids": rng.integers(1, 1024, size=(n, high), dtype=np.int32), "n": lengths})
    return frame.select(pl.col("ids").arr.to_list().list.head(pl.col("n"))).to_series()


def generation_rows(
    shard: int,
    n: int,
    *,
    first_row: int | None = None,
    identity: str = IDENTITY,
    seed: int = 0,
    failed: float = 0.05,
    skipped: float = 0.02,
    truncated: float = 0.1,
    tokens: tuple[int, int] = (16, 64),
) -> pl.DataFrame:
    """`n` rows of shard `shard` as `generate_shard` writes them.

    Args:
        shard: the shard number k (column `shard`).
        n: rows (prompts) in the shard.
        first_row: dataset row of the first prompt; default shard * n (shards of equal size).
        identity: the server identity hash every row carries.
        seed: random seed (with the shard number) for statuses, lengths and token ids.
        failed: fraction of rows whose request failed (status failed, no reply).
        skipped: fraction skipped before sending (prompt too long).
        truncated: fraction of ok rows cut off by max_tokens (finish_reason length, no answer).
        tokens: (min, max) length of the prompt and completion token id lists.
    """
    rng = np.random.default_rng([seed, shard])
    rows = np.arange(n, dtype=np.int64) + (shard * n if first_row is None else first_row)
    draw = rng.random(n)
    status = np.where(draw < failed, "failed", np.where(draw < failed + skipped, "skipped", "ok"))
    ok = status == "ok"
    cut = ok & (rng.random(n) < truncated)
    prompt_ids = _token_lists(rng, n, *tokens)
    completion_ids = _token_lists(rng, n, *tokens)
    a, b = rng.integers(1, 100, size=(2, n))
    frame = pl.DataFrame(
        {
            "id": _ids(rows),
            "row": rows,
            "source": np.array(SOURCES)[rows % len(SOURCES)],
            "a": a,
            "b": b,
            "status": status,
            "ok": ok,
            "cut": cut,
            "prompt_token_ids": prompt_ids,
            "completion_token_ids": completion_ids,
            "latency_s": rng.gamma(2.0, 1.5, size=n),
        }
    )
    return frame.select(_columns(shard, identity)).select(
        pl.col(name).cast(dtype) for name, dtype in GENERATION_SCHEMA.items()
    )


def _columns(shard: int, identity: str) -> list[pl.Expr]:
    ok, cut, row = pl.col("ok"), pl.col("cut"), pl.col("row").cast(pl.String)
    a, b = pl.col("a").cast(pl.String), pl.col("b").cast(pl.String)
    thinking = pl.concat_str(pl.lit("I need to compute "), a, pl.lit(" + "), b, pl.lit(". ")) + pl.lit(
        "Let me add the tens, then the units. "
    ).repeat_by(pl.col("a") % 7 + 1).list.join("")
    answer = pl.concat_str(pl.lit("The answer is "), (pl.col("a") + pl.col("b")).cast(pl.String), pl.lit("."))
    reason = pl.when(pl.col("status") == "failed").then(pl.lit("HTTP 500: engine error"))
    return [
        pl.col("id"),
        pl.lit(shard).alias("shard"),
        pl.col("source"),
        pl.col("row"),
        pl.lit(0).alias("turn"),
        pl.when(pl.col("row") % 3 == 0).then(pl.lit("You are a careful assistant.")).alias("system"),
        pl.concat_str(pl.lit("Question "), row, pl.lit(": what is "), a, pl.lit(" + "), b, pl.lit("?")).alias(
            "question"
        ),
        answer.alias("original_answer"),
        pl.when(ok).then(thinking).alias("reasoning"),
        pl.when(ok & ~cut).then(answer).alias("content"),
        pl.when(ok)
        .then(pl.when(cut).then(pl.lit("length")).otherwise(pl.lit("stop")))
        .alias("finish_reason"),
        pl.col("prompt_token_ids"),
        pl.when(ok)
        .then(pl.col("completion_token_ids"))
        .otherwise(pl.lit([], dtype=pl.List(pl.Int32)))
        .alias("completion_token_ids"),
        pl.col("prompt_token_ids").list.len().alias("prompt_tokens"),
        pl.when(ok).then(pl.col("completion_token_ids").list.len()).otherwise(0).alias("completion_tokens"),
        pl.col("status"),
        pl.when(pl.col("status") == "skipped")
        .then(pl.lit("prompt longer than max_model_len"))
        .otherwise(reason)
        .alias("reason"),
        pl.col("latency_s"),
        pl.lit(512).alias("max_tokens"),
        pl.lit(0.6).alias("temperature"),
        pl.lit(0.95).alias("top_p"),
        pl.lit(0).alias("seed"),
        pl.lit(identity).alias("server_identity"),
    ]


def write_generation_shards(
    directory: str | Path, num_shards: int, rows_per_shard: int, **kwargs
) -> list[Path]:
    """Write shard-00000.parquet ... into `directory` (created); return their paths in order."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for shard in range(num_shards):
        path = directory / f"shard-{shard:05d}.parquet"
        generation_rows(shard, rows_per_shard, **kwargs).write_parquet(path)
        paths.append(path)
    return paths


def write_identity(path: str | Path, identity: str = IDENTITY) -> Path:
    """The snapshot's identity.json: {"identity": hash, "fields": {...}}."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'{{"identity": "{identity}", "fields": {{"model": "demo"}}}}\n')
    return path


@pytest.fixture
def generation_shards(tmp_path: Path) -> list[Path]:
    """Four shards of 50 rows each (with failures, skips and truncations) under tmp_path/generations."""
    return write_generation_shards(tmp_path / "generations", 4, 50)


@pytest.fixture
def server_identity(tmp_path: Path) -> Path:
    """identity.json matching the rows of `generation_shards`."""
    return write_identity(tmp_path / "server" / "identity.json")


def checked_traces(results: Path, shards: int, record: dict) -> None:
    """Every shard's traces (empty files: a disk-cap plan reads only their times) and its
    check_disk_budget `record`, newer than its traces, as a run that generated and checked them leaves
    them under `results` (results/{run})."""
    import json
    import os

    for k in range(shards):
        for split in ("train", "validation"):
            trace = results / "traces" / "shards" / split / f"shard-{k:05d}.parquet"
            trace.parent.mkdir(parents=True, exist_ok=True)
            trace.write_bytes(b"")
            os.utime(trace, ns=(10**18, 10**18))
        path = results / "budget" / "hidden_states" / f"shard-{k:05d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))
        os.utime(path, ns=(10**18 + 1, 10**18 + 1))
