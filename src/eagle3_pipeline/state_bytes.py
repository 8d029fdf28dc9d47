"""What the stored hidden states weigh: bytes per token, the unit hidden_states.max_disk_gb counts in,
sizes written for people, and the error raised when a disk cannot hold them.

Per token, extraction stores three auxiliary hidden states and the final one (4 x H values in the
storage dtype) plus the input id (int64) and the loss mask (one byte):

    bytes = tokens x (4 x H x itemsize + 9)

For Kimi-K2.5 (H = 7168, bf16) that is 57,353 bytes a token: about 470 MB for one 8k-token sample.
The disk budget (budget.py) and the disk cap's plan (planning/disk_cap.py) both count with it.
"""

from __future__ import annotations

STATE_COUNT = 4  # three auxiliary layers + the final hidden state
TOKEN_OVERHEAD_BYTES = 9  # input id (int64) + loss mask (uint8)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
GB = 1000**3  # hidden_states.max_disk_gb counts in powers of 1000, as disks are sold


class DiskBudgetError(RuntimeError):
    """The results filesystem (or hidden_states.max_disk_gb) cannot hold the hidden states; the message
    gives the numbers and fixes."""


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
