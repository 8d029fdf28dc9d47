"""How full training batches are: today's batcher (draft/data.plan_batches) beside simple alternatives.

A batch holds whole samples padded to its longest, rows x longest <= train.batch_tokens. Two fills per
epoch: `budget_fill` = real tokens / (batches x batch_tokens), the share of each step's memory budget
that trains; `padding_fill` = real tokens / (rows x longest), what padding leaves. Beside today's
(samples sorted by length inside windows of SORT_WINDOW = 64, then packed greedily) the same with
wider sort windows (256, 1,024, the whole epoch: less padding, but the whole epoch's sort gives every
epoch the same batches, only reordered), and `packed_bound`, what sequence packing (several samples in
one row, attention masked between them) could reach at most: ceil(tokens / budget) batches.

    .venv/bin/python benchmarks/batch_fill.py --states results/demo/hidden_states/train --batch-tokens 1024
    .venv/bin/python benchmarks/batch_fill.py --synthetic 2000,0.8 --batch-tokens 16384 --max-len 10240

--synthetic MEDIAN,SIGMA draws 20,000 log-normal lengths (clamped to 100..--max-len): a stand-in for
long-thinking traces, not data. One JSON line per batcher and epoch.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import sys

import torch

import eagle3_pipeline.draft.data as data


def fills(lengths: list[int], batches: list[list[int]], budget: int) -> dict[str, float]:
    real = sum(lengths[i] for batch in batches for i in batch)
    padded = sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)
    return {
        "batches": len(batches),
        "rows_per_batch": round(sum(map(len, batches)) / len(batches), 2),
        "budget_fill": round(real / (len(batches) * budget), 3),
        "padding_fill": round(real / padded, 3),
    }


def lengths_of(a: argparse.Namespace) -> list[int]:
    if a.states:
        paths = sorted(glob.glob(f"{a.states}/shard-*.safetensors"))
        return [s.length for s in data.HiddenStateData(paths, a.batch_tokens).samples]
    median, sigma = (float(x) for x in a.synthetic.split(","))
    generator = torch.Generator().manual_seed(0)
    drawn = torch.exp(torch.randn(20000, generator=generator) * sigma + math.log(median))
    return drawn.clamp(100, min(a.max_len, a.batch_tokens)).long().tolist()


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--states", help="a folder of hidden-state shards (shard-*.safetensors)")
    source.add_argument("--synthetic", help="MEDIAN,SIGMA of log-normal sample lengths")
    p.add_argument("--batch-tokens", type=int, required=True, help="train.batch_tokens")
    p.add_argument("--max-len", type=int, default=10240, help="--synthetic: hidden_states.max_seq_len")
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args(argv)
    lengths = lengths_of(a)
    source = {"source": a.states or f"synthetic {a.synthetic}", "samples": len(lengths)}
    source |= {"mean_length": round(sum(lengths) / len(lengths)), "batch_tokens": a.batch_tokens}
    today = data.SORT_WINDOW
    for window in (today, 256, 1024, len(lengths)):
        data.SORT_WINDOW = window
        for epoch in range(a.epochs):
            plan = data.plan_batches(lengths, a.batch_tokens, seed=0, epoch=epoch)
            batcher = "today" if window == today else f"sort_window_{window}"
            record = {"measure": "batch_fill", "batcher": batcher, "epoch": epoch}
            sys.stdout.write(json.dumps(source | record | fills(lengths, plan, a.batch_tokens)) + "\n")
    data.SORT_WINDOW = today
    batches = math.ceil(sum(lengths) / a.batch_tokens)
    bound = {"measure": "batch_fill", "batcher": "packed_bound", "batches": batches}
    sys.stdout.write(
        json.dumps(source | bound | {"budget_fill": round(sum(lengths) / (batches * a.batch_tokens), 3)})
        + "\n"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
