"""Packed hidden-state shards: the packing writer, validation and a memory-mapped reader.

Layout of `shard-{k:05d}.safetensors` (all samples' rows concatenated; sample i is rows
offsets[i]:offsets[i+1]):

    input_ids            int32  [T]
    loss_mask            uint8  [T]        1 over completion tokens (thinking + answer)
    aux_hidden_states    bf16   [T, 3*H]   three aux layer outputs, increasing layer order
    final_hidden_states  bf16   [T, H]     after the final norm (what lm_head sees)
    offsets              int64  [N+1]

`PackedShardFile` moves the per-batch parts of the work folder into the shard one part at a time, each
part deleted once its rows are written in place, so the shard is on disk once while it is packed (plus
one part), never as parts plus a full copy.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from eagle3_pipeline import io

FORMAT = "eagle3-pipeline/hidden-states/1"
TENSORS = ("input_ids", "loss_mask", "aux_hidden_states", "final_hidden_states")
ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int64: "I64"}
ST_DTYPES.update({torch.int32: "I32", torch.uint8: "U8"})
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SCAN_ROWS = 4096  # rows per chunk when scanning a shard for NaN/Inf


class ShardError(ValueError):
    """A hidden-state file that is malformed or disagrees with what it should contain."""


def write_json(data: dict[str, Any], path: Path) -> None:
    """A metadata or progress record, written atomically in this stage's layout (indent 1, sorted)."""
    io.write_json(data, path, indent=1, sort_keys=True)


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes, little-endian as safetensors wants (torch on x86/ARM is little-endian)."""
    flat = tensor.contiguous().reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy()).cast("B")


def _layout(
    lengths: Sequence[int], hidden_size: int, dtype: torch.dtype
) -> list[tuple[str, torch.dtype, list[int]]]:
    total = sum(lengths)
    # bf16 blocks first, then int64, int32, uint8: every tensor starts aligned to its element size
    return [
        ("aux_hidden_states", dtype, [total, 3 * hidden_size]),
        ("final_hidden_states", dtype, [total, hidden_size]),
        ("offsets", torch.int64, [len(lengths) + 1]),
        ("input_ids", torch.int32, [total]),
        ("loss_mask", torch.uint8, [total]),
    ]


def _header(layout: list[tuple[str, torch.dtype, list[int]]], metadata: dict[str, str]) -> tuple[bytes, int]:
    """(the header's JSON, unpadded; the data's length) of a packed shard."""
    header: dict[str, Any] = {"__metadata__": metadata}
    start = 0
    for name, tdtype, shape in layout:
        end = start + math.prod(shape) * tdtype.itemsize
        header[name] = {"dtype": ST_DTYPES[tdtype], "shape": shape, "data_offsets": [start, end]}
        start = end
    return json.dumps(header, separators=(",", ":")).encode(), start


class PackedShardFile:
    """A packed shard (the layout above) filled in any order, each piece written in place (pwrite):
    parts are moved in one at a time and deleted, so a shard is on disk once, not as parts plus a copy.

    Created at its full size as a sparse file (blocks are allocated as rows are written); the header
    keeps HEADER_SLACK spare bytes so that `close` can write the final metadata in place. Reopened
    (`resume`) after a job died while packing: the pieces already written stay.
    """

    HEADER_SLACK = 4096

    def __init__(
        self,
        path: Path,
        lengths: Sequence[int],
        hidden_size: int,
        dtype: torch.dtype,
        metadata: dict[str, str],
        resume: bool = False,
    ) -> None:
        self.path, self.lengths = Path(path), list(lengths)
        self.layout = _layout(self.lengths, hidden_size, dtype)
        blob, data_bytes = _header(self.layout, metadata)
        if resume and self.path.exists():
            with open(self.path, "rb") as handle:
                self.capacity = struct.unpack("<Q", handle.read(8))[0]
            if self.path.stat().st_size != 8 + self.capacity + data_bytes:
                raise ShardError(f"{self.path}: a packed shard of another plan; delete its work folder")
        else:
            self.capacity = len(blob) + self.HEADER_SLACK + (-(len(blob) + self.HEADER_SLACK) % 8)
            with open(self.path, "wb") as handle:
                handle.write(struct.pack("<Q", self.capacity) + blob.ljust(self.capacity))
                handle.truncate(8 + self.capacity + data_bytes)  # sparse: no block until written
        self.starts: dict[str, tuple[int, int]] = {}  # name -> (file offset, bytes per row)
        offset = 8 + self.capacity
        for name, tdtype, shape in self.layout:
            row = math.prod(shape[1:]) * tdtype.itemsize
            self.starts[name] = (offset, row)
            offset += shape[0] * row
        self.fd = os.open(self.path, os.O_RDWR)

    def write_rows(self, name: str, row: int, tensor: torch.Tensor) -> None:
        """Rows row.. of tensor `name` (a [n, ...] piece in the storage dtype)."""
        offset, row_bytes = self.starts[name]
        data = _raw_bytes(tensor)
        written = os.pwrite(self.fd, data, offset + row * row_bytes)
        if written != len(data):
            raise OSError(f"{self.path}: short write ({written} of {len(data)} bytes)")

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self, metadata: dict[str, str], input_ids: torch.Tensor, loss_mask: torch.Tensor) -> None:
        """Write what the plan knows (offsets, ids, mask) and the final metadata, then fsync and close."""
        self.write_rows("offsets", 0, torch.tensor([0, *self.lengths], dtype=torch.int64).cumsum(0))
        self.write_rows("input_ids", 0, input_ids)
        self.write_rows("loss_mask", 0, loss_mask)
        blob, _ = _header(self.layout, metadata)
        if len(blob) > self.capacity:
            raise ShardError(f"{self.path}: the final metadata outgrew the header; delete its work folder")
        os.pwrite(self.fd, blob.ljust(self.capacity), 8)
        self.sync()
        self.abandon()

    def abandon(self) -> None:
        """Close without finishing (the pieces written stay, for a resume)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class HiddenStateShard:
    """A packed shard opened memory-mapped: samples come out as dicts of tensors, read on demand.

    Usage:
        with HiddenStateShard(path) as shard:
            shard.metadata["aux_layers"]
            for sample in shard:                      # {input_ids, loss_mask, aux_hidden_states,
                ...                                   #  final_hidden_states}

    When the metadata says `"final_rows": "loss_mask"` (final state stored only where loss_mask == 1),
    `final_hidden_states` comes back full length with zeros elsewhere; this writer stores all rows.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file = safe_open(str(self.path), framework="pt", device="cpu")
        raw = self._file.metadata() or {}
        if raw.get("format") != FORMAT:
            raise ShardError(f"{self.path}: not a hidden-state shard (format {raw.get('format')!r})")
        self.metadata: dict[str, Any] = {k: json.loads(v) for k, v in raw.items() if k != "format"}
        self.offsets = self._file.get_tensor("offsets")
        self._final_rows = self.metadata.get("final_rows", "all")
        self._final_index = None
        if self._final_rows == "loss_mask":
            mask = self._file.get_tensor("loss_mask").to(torch.int64)
            self._final_index = mask.cumsum(0) - mask  # row of token t in the compacted final tensor

    def __enter__(self) -> HiddenStateShard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def tensor_slice(self, name: str, start: int, end: int) -> torch.Tensor:
        """Rows start:end of a packed tensor, read from the memory map."""
        return self._file.get_slice(name)[start:end]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        index %= len(self)
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        sample = {name: self.tensor_slice(name, start, end) for name in TENSORS[:3]}
        sample["final_hidden_states"] = self._final(start, end, sample["loss_mask"])
        return sample

    def _final(self, start: int, end: int, loss_mask: torch.Tensor) -> torch.Tensor:
        if self._final_index is None:
            return self.tensor_slice("final_hidden_states", start, end)
        rows = self._final_index[start:end]
        lo = int(rows[0]) if end > start else 0
        packed = self.tensor_slice("final_hidden_states", lo, lo + int(loss_mask.sum()))
        full = torch.zeros(end - start, packed.shape[-1], dtype=packed.dtype)
        full[loss_mask.bool()] = packed
        return full

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for index in range(len(self)):
            yield self[index]


def check_finite(shard: HiddenStateShard, name: str) -> None:
    """Raise ShardError when a hidden-state tensor holds NaN or Inf (scanned in chunks)."""
    total = shard._file.get_slice(name).get_shape()[0]
    for start in range(0, total, SCAN_ROWS):
        chunk = shard.tensor_slice(name, start, min(total, start + SCAN_ROWS))
        if not torch.isfinite(chunk).all():
            raise ShardError(f"{shard.path}: {name} has NaN/Inf in rows {start}..{start + len(chunk)}")


def validate_shard(
    path: Path, expected_ids: Sequence[str], expected_input_ids: Sequence[Sequence[int]], hidden_size: int
) -> None:
    """Check a written shard against what it should hold.

    Sample ids and token ids match the sequences, offsets are consistent, shapes agree with the target's
    hidden size, and no hidden state is NaN or Inf.

    Raises:
        ShardError: naming the first disagreement.
    """
    with HiddenStateShard(path) as shard:
        meta = shard.metadata
        if list(meta.get("ids", [])) != list(expected_ids) or len(shard) != len(expected_ids):
            raise ShardError(f"{path}: sample ids differ from the trace rows they were built from")
        lengths = [len(s) for s in expected_input_ids]
        expected_offsets = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
        if not torch.equal(shard.offsets, expected_offsets):
            raise ShardError(f"{path}: offsets disagree with the sequence lengths")
        total = sum(lengths)
        shapes = {
            "input_ids": [total],
            "loss_mask": [total],
            "aux_hidden_states": [total, 3 * hidden_size],
            "final_hidden_states": [total, hidden_size],
        }
        for name, shape in shapes.items():
            got = list(shard._file.get_slice(name).get_shape())
            if got != shape:
                raise ShardError(
                    f"{path}: {name} has shape {got}, expected {shape} (hidden_size {hidden_size})"
                )
        flat = [t for seq in expected_input_ids for t in seq]
        if not torch.equal(shard._file.get_tensor("input_ids"), torch.tensor(flat, dtype=torch.int32)):
            raise ShardError(f"{path}: input_ids differ from the sequences")
        check_finite(shard, "aux_hidden_states")
        check_finite(shard, "final_hidden_states")


def encode_metadata(meta: dict[str, Any]) -> dict[str, str]:
    """safetensors string metadata: each key JSON-encoded (token_counts left to the .json sibling)."""
    encoded = {k: json.dumps(v) for k, v in meta.items() if k != "token_counts"}
    encoded["format"] = FORMAT
    return encoded
