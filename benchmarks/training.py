"""Draft training speed: tokens/s and step time beside the step's FLOPs at this machine's matmul rate.

One run measures, side by side and for each torch thread count: square-matmul GFLOP/s in fp32 and
bf16 (the machine's ceiling for a FLOP-bound step), then full TTT training steps (target
distribution, draft forward over all steps, loss, backward, clip, AdamW) on a synthetic batch, in
fp32 and under bf16 autocast. For each it prints the step's forward+backward FLOPs, the time those
FLOPs would take at the measured matmul rate, and the measured step time: their ratio is the
fraction of the machine the training step uses.

FLOPs counted (2 per multiply-add; backward = 2x forward for trained matmuls, 1x for fc, whose input
needs no gradient; the target head once, no gradient; attention as implemented: a dense T x T block
per step plus one diagonal per earlier step).

    .venv/bin/python benchmarks/training.py                       # demo shape (H 128, 2 x 64 heads)
    .venv/bin/python benchmarks/training.py --hidden 1024 --heads 8 --intermediate 2816 --vocab 32000
Prints one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from contextlib import nullcontext

import torch

from eagle3_pipeline.draft.config import DraftConfig
from eagle3_pipeline.draft.model import Eagle3Draft
from eagle3_pipeline.draft.ttt import Batch, target_distribution, ttt_loss

log = logging.getLogger("benchmarks.training")


def emit(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def matmul_gflops(dtype: torch.dtype, n: int, seconds: float = 2.0) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b  # warm-up
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2 * n**3 * count / (time.perf_counter() - start) / 1e9


def step_flops(c: DraftConfig, batch: int, seq: int, steps: int) -> dict[str, float]:
    """Forward and backward FLOPs of one TTT training step on `batch` rows of `seq` tokens."""
    tokens = batch * seq
    h, q_width, kv_width = (
        c.hidden_size,
        c.num_attention_heads * c.head_dim,
        c.num_key_value_heads * c.head_dim,
    )
    per_step = 2 * tokens * (2 * h * (q_width + 2 * kv_width) + q_width * h + 3 * h * c.intermediate_size)
    per_step += 2 * tokens * h * c.draft_vocab_size  # lm_head
    attention = sum(2 * 2 * tokens * q_width * (seq + k) for k in range(steps))  # QK^T and PV
    fc = 2 * tokens * 3 * c.target_hidden_size * h
    target_head = 2 * tokens * h * c.vocab_size
    forward = fc + steps * per_step + attention
    backward = fc + 2 * (steps * per_step + attention)
    return {"forward": forward + target_head, "backward": backward, "total": forward + backward + target_head}


def synthetic_batch(c: DraftConfig, batch: int, seq: int) -> Batch:
    generator = torch.Generator().manual_seed(0)
    return Batch(
        input_ids=torch.randint(0, c.vocab_size, (batch, seq), generator=generator),
        loss_mask=torch.ones(batch, seq, dtype=torch.bool),
        aux_hidden_states=torch.randn(batch, seq, 3 * c.target_hidden_size, generator=generator).bfloat16(),
        final_hidden_states=torch.randn(batch, seq, c.hidden_size, generator=generator).bfloat16(),
        has_final=torch.ones(batch, seq, dtype=torch.bool),
    )


def time_training(c: DraftConfig, batch: int, seq: int, steps: int, bf16: bool, repeats: int) -> float:
    """Median seconds per training step (after one warm-up step)."""
    torch.manual_seed(0)
    model = Eagle3Draft(c)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    lm_head = torch.randn(c.vocab_size, c.hidden_size)
    t2d = torch.ones(c.vocab_size, dtype=torch.bool)
    ids = torch.arange(c.draft_vocab_size)
    data = synthetic_batch(c, batch, seq)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        probs, in_draft = target_distribution(data.final_hidden_states, lm_head, t2d, ids)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()
        with autocast:
            logits = model(data.aux_hidden_states, data.input_ids, steps)
        loss, _ = ttt_loss(logits, data, probs, in_draft, 0.8)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--draft-vocab", type=int, default=None, help="default: the whole vocabulary")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--ttt-steps", type=int, default=7)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--matmul-n", type=int, default=1024)
    p.add_argument("--threads", default="1,2", help="torch thread counts to compare (comma-separated)")
    a = p.parse_args(argv)
    c = DraftConfig(
        hidden_size=a.hidden, target_hidden_size=a.hidden, intermediate_size=a.intermediate,
        num_attention_heads=a.heads, num_key_value_heads=a.heads, head_dim=a.hidden // a.heads,
        rms_norm_eps=1e-6, rope_theta=1e4, max_position_embeddings=8192, vocab_size=a.vocab,
        draft_vocab_size=a.draft_vocab or a.vocab,
    )  # fmt: skip
    flops = step_flops(c, a.batch, a.seq, a.ttt_steps)
    tokens = a.batch * a.seq
    for threads in [int(t) for t in a.threads.split(",")]:
        torch.set_num_threads(threads)
        rates = {
            name: matmul_gflops(dtype, a.matmul_n)
            for name, dtype in [("fp32", torch.float32), ("bf16", torch.bfloat16)]
        }
        emit({"measure": "matmul_gflops", "n": a.matmul_n, "threads": threads, **rates})
        for precision, bf16 in [("fp32", False), ("bf16_autocast", True)]:
            seconds = time_training(c, a.batch, a.seq, a.ttt_steps, bf16, a.repeats)
            at_rate = flops["total"] / (rates["bf16" if bf16 else "fp32"] * 1e9)
            shape = {"hidden": a.hidden, "heads": a.heads, "intermediate": a.intermediate}
            shape |= {"vocab": a.vocab, "draft_vocab": c.draft_vocab_size}
            record = {"measure": "train_step", "precision": precision, "threads": threads, "shape": shape}
            record |= {"batch": a.batch, "seq": a.seq, "ttt_steps": a.ttt_steps, "tokens_per_step": tokens}
            record |= {"step_s": round(seconds, 4), "tokens_per_s": round(tokens / seconds, 1)}
            record |= {"step_gflop": round(flops["total"] / 1e9, 2), "flop_bound_step_s": round(at_rate, 4)}
            emit(record | {"fraction_of_matmul_rate": round(at_rate / seconds, 3)})


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    main(sys.argv[1:])
