"""Atomic writes: every file the pipeline produces appears whole or not at all.

A reader (the next rule, a resumed job, a user tailing results/) never sees a half-written file: each
writer fills a temporary file in the destination's own folder (same filesystem, so the rename is
atomic), fsyncs it, then `os.replace`s it onto the destination. On any failure the temporary file is
removed and the destination is left as it was. The destination's folder is created when missing.

Every format goes through `atomic_path`, so there is one place that decides how a file is committed:

    write_json(data, path)                      # json.dumps(...) + "\\n"
    write_text(text, path)
    write_parquet(frame, path, **polars_kwargs) # polars DataFrame.write_parquet options pass through
    write_safetensors(tensors, path, metadata)
    write_torch(obj, path)                      # torch.save (training state)
    with atomic_path(path) as tmp: ...          # anything else: a plot, a streamed sink_parquet
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # heavy imports only where a format needs them
    import polars as pl
    import torch

PathLike = str | os.PathLike[str]


def temp_path(path: PathLike) -> Path:
    """A fresh temporary name beside `path`: hidden, unique per call (two writers never share one)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")


def commit(tmp: PathLike, path: PathLike) -> None:
    """fsync the finished temporary file, rename it onto `path`, and fsync the folder (the rename)."""
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(Path(path).parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform or filesystem without directory handles: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; commit it onto `path` only if the block succeeds.

    The folder of `path` is created. The temporary file is removed whatever happens, so a failure
    (an exception, a KeyboardInterrupt) leaves neither a partial destination nor a stray temporary.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        yield tmp
        commit(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(text: str, path: PathLike) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(
    data: Any, path: PathLike, *, indent: int | None = 2, sort_keys: bool = False, **dumps: Any
) -> None:
    """Write `json.dumps(data, indent=..., sort_keys=...)` plus a newline to `path` atomically.

    Args:
        data: Anything `json.dumps` takes.
        path: The destination.
        indent: As `json.dumps` (each output keeps the layout it has always had).
        sort_keys: As `json.dumps`.
        **dumps: Further `json.dumps` options (`default=str`, `ensure_ascii=False`).
    """
    write_text(json.dumps(data, indent=indent, sort_keys=sort_keys, **dumps) + "\n", path)


def write_parquet(frame: pl.DataFrame, path: PathLike, **options: Any) -> None:
    """`frame.write_parquet(**options)` to `path` atomically (options: compression, statistics, ...)."""
    with atomic_path(path) as tmp:
        frame.write_parquet(tmp, **options)


def write_safetensors(
    tensors: Mapping[str, torch.Tensor], path: PathLike, metadata: Mapping[str, str] | None = None
) -> None:
    """A safetensors file of `tensors` (made contiguous) with string `metadata`, written atomically."""
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file(
            {k: v.contiguous() for k, v in tensors.items()},
            str(tmp),
            metadata=dict(metadata) if metadata is not None else None,
        )


def write_torch(obj: Any, path: PathLike) -> None:
    """`torch.save(obj)` to `path` atomically (a training state: a crash mid-save keeps the last one)."""
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
