"""Selection blocks and prompt shards as rows of the selection order: the arithmetic that
rules/common/inputs.smk runs at parse time, apart from prompts.py (which loads polars: a parse of the
workflow needs none of it).

Selection block b holds questions [b * B, (b + 1) * B) of the order, B = SELECTION_BLOCK_SHARDS x
shard_size, whatever num_samples is; shard k is questions [k * shard_size, (k + 1) * shard_size).
"""

from __future__ import annotations

# Shards per selection block. A block's content depends on the dataset, seed, turns and shard_size,
# never on num_samples, so raising num_samples reruns no done block (and, below it, no done shard).
# Each block streams the whole dataset once: 64 shards of work per scan.
SELECTION_BLOCK_SHARDS = 64


def selection_block_rows(block: int, shard_size: int) -> tuple[int, int]:
    """Questions [start, stop) of the selection order held by selection block `block`."""
    rows = SELECTION_BLOCK_SHARDS * shard_size
    return block * rows, (block + 1) * rows


def selection_block(shard: int) -> int:
    """The selection block that holds shard `shard`."""
    return shard // SELECTION_BLOCK_SHARDS


def prompt_shard_rows(shard: int, shard_size: int, num_samples: int) -> tuple[int, int]:
    """Shard `shard`'s rows [start, stop) of its selection block's file: questions [k * shard_size,
    min((k + 1) * shard_size, num_samples)) of the order, less the block's first question."""
    block_start, _ = selection_block_rows(selection_block(shard), shard_size)
    start = shard * shard_size
    return start - block_start, min(start + shard_size, num_samples) - block_start
