"""Training-time-test attention, in memory linear in T at any number of TTT steps.

At TTT step k a query at position t sees step 0's keys causally (positions 0..t) and, at its own
position only, the key each later step 1..k produced there (benchmarks/ttt_reference.py spells the mask
out).
Softmax runs over the union of those keys. Shapes: q and every cached k are [B, nh, T, hd], every
cached v [B, nh, T, hd_v] (hd_v = hd for the Llama draft; MLA's values are narrower than its queries and
keys, 128 against 192 at Kimi's shape), the output [B, nh, T, hd_v]. Scores are scaled by `scale`,
1 / sqrt(hd) unless given (MLA under YaRN multiplies it by the rope's mscale squared).

Two forms, equal up to rounding (tests check forward and gradients):

- the reference, `ttt_attention_dense` in benchmarks/ttt_reference.py (the tests and the training
  benchmark's "before"; not in the package): a [B, nh, T, T] causal score block plus one [B, nh, T, 1]
  diagonal score per earlier step, softmax over both. Autograd keeps the T x T scores and their fp32
  softmax of every step until the backward pass: memory O(steps * nh * T^2).
- `ttt_attention`, what the draft trains with: the same numbers computed by query blocks, flash-attention
  style, in a custom autograd function. Each block of C queries builds its [B, nh, C, T] causal scores and
  its [B, nh, C, k] diagonal scores, merges them through one max and one log-sum-exp (softmax over the
  union), writes its output and throws the scores away. Only q, the cache, the output and the per-row
  log-sum-exp [B, nh, T] are kept for backward, which recomputes each block's probabilities from the
  log-sum-exp (P = exp(S - lse)). Memory: O(steps * nh * T * hd) kept, plus one block's scores while it
  runs (C is chosen so that a block holds at most BLOCK_ELEMENTS scores, and at least MIN_BLOCK_ROWS
  rows): linear in T.
  Plain tensor ops, so it runs on CPU and GPU alike and the log-sum-exp's own gradient (which
  torch's fused SDPA kernels do not differentiate) is exact.
"""

from __future__ import annotations

import math

import torch

KVCache = list[
    tuple[torch.Tensor, torch.Tensor]
]  # one (keys [B, nh, T, hd], values [B, nh, T, hd_v]) per step
BLOCK_ELEMENTS = 2**24  # scores per query block: 64 MB in fp32, a few such tensors live at once
MIN_BLOCK_ROWS = 64  # below this the matmuls get too thin (Kimi-K2.5: 64 heads x 10,240 keys: 168 MB)


def default_scale(q: torch.Tensor) -> float:
    return 1.0 / math.sqrt(q.shape[-1])


def _wide(x: torch.Tensor) -> torch.Tensor:
    """x in at least fp32 (softmax and accumulators; fp64 stays fp64, for gradcheck)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def block_size(batch: int, heads: int, seq_len: int) -> int:
    """Queries per block so that one block's [B, nh, C, T] scores hold at most BLOCK_ELEMENTS (but at
    least MIN_BLOCK_ROWS rows)."""
    return min(seq_len, max(MIN_BLOCK_ROWS, BLOCK_ELEMENTS // max(1, batch * heads * seq_len)))


def _block_scores(
    q: torch.Tensor, k0: torch.Tensor, keys: tuple[torch.Tensor, ...], start: int, end: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 scores of queries start..end-1: causal over k0[:end] [B, nh, C, end] (-inf above the
    diagonal) and diagonal over each later step's same-position key [B, nh, C, len(keys)]."""
    qb = q[:, :, start:end]
    scores = _wide(qb @ k0[:, :, :end].transpose(-1, -2)) * scale
    rows = torch.arange(start, end, device=q.device)[:, None]
    scores = scores.masked_fill(torch.arange(end, device=q.device)[None] > rows, float("-inf"))
    diagonal = [_wide((qb * k[:, :, start:end]).sum(-1)) * scale for k in keys]
    empty = scores.new_empty(*scores.shape[:-1], 0)
    return scores, torch.stack(diagonal, dim=-1) if diagonal else empty


class _LinearTTTAttention(torch.autograd.Function):
    """Blocked TTT attention with a log-sum-exp merge; see the module docstring. Arguments: the score
    scale, q, k0, v0, then the keys of steps 1..k, then their values (a flat tuple: autograd wants
    tensors)."""

    @staticmethod
    def forward(ctx, scale: float, q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, *later: torch.Tensor):  # noqa: ANN001
        keys, values = later[: len(later) // 2], later[len(later) // 2 :]
        batch, heads, seq_len, _ = q.shape
        out = q.new_empty(batch, heads, seq_len, v0.shape[-1])  # hd_v: MLA's values are narrower
        lse = _wide(q.new_empty(batch, heads, seq_len))
        block = block_size(batch, heads, seq_len)
        for start in range(0, seq_len, block):
            end = min(seq_len, start + block)
            scores, diagonal = _block_scores(q, k0, keys, start, end, scale)
            top = torch.maximum(scores.amax(-1), diagonal.amax(-1) if keys else scores.amax(-1))
            probs, diag_probs = (scores - top[..., None]).exp(), (diagonal - top[..., None]).exp()
            total = probs.sum(-1) + diag_probs.sum(-1)  # [B, nh, C]
            acc = _wide(probs.to(v0.dtype) @ v0[:, :, :end])
            for j, v in enumerate(values):
                acc = acc + diag_probs[..., j : j + 1] * _wide(v[:, :, start:end])
            out[:, :, start:end] = (acc / total[..., None]).to(q.dtype)
            lse[:, :, start:end] = top + total.log()
        ctx.save_for_backward(q, k0, v0, out, lse, *later)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # noqa: ANN001
        q, k0, v0, out, lse, *later = ctx.saved_tensors
        keys, values = later[: len(later) // 2], later[len(later) // 2 :]
        batch, heads, seq_len, _ = q.shape
        scale = ctx.scale
        grad_out = grad_out.contiguous()
        # D = rowsum(dO * O): the softmax backward's subtracted term, per query row
        delta = (_wide(grad_out) * _wide(out)).sum(-1)  # [B, nh, T]
        dq = torch.zeros_like(_wide(q))
        dk0, dv0 = torch.zeros_like(_wide(k0)), torch.zeros_like(_wide(v0))
        # each later step's gradients are written once per block, never accumulated: in their own dtype
        dkeys = [torch.empty_like(k) for k in keys]
        dvalues = [torch.empty_like(v) for v in values]
        block = block_size(batch, heads, seq_len)
        for start in range(0, seq_len, block):
            end = min(seq_len, start + block)
            scores, diagonal = _block_scores(q, k0, keys, start, end, scale)
            rows_lse, rows_delta = lse[:, :, start:end, None], delta[:, :, start:end, None]
            probs, diag_probs = (scores - rows_lse).exp(), (diagonal - rows_lse).exp()
            qb, gb = q[:, :, start:end], grad_out[:, :, start:end]
            dv0[:, :, :end] += _wide(probs.to(gb.dtype).transpose(-1, -2) @ gb)
            dscores = probs * (_wide(gb @ v0[:, :, :end].transpose(-1, -2)) - rows_delta)
            dscores = dscores.to(q.dtype)
            dq[:, :, start:end] += _wide(dscores @ k0[:, :, :end]) * scale
            dk0[:, :, :end] += _wide(dscores.transpose(-1, -2) @ qb) * scale
            for j, (k, v) in enumerate(zip(keys, values, strict=True)):
                p = diag_probs[..., j : j + 1]  # [B, nh, C, 1]
                dvalues[j][:, :, start:end] = (p * _wide(gb)).to(v.dtype)
                dp = (_wide(gb) * _wide(v[:, :, start:end])).sum(-1, keepdim=True)
                ds = p * (dp - rows_delta) * scale
                dq[:, :, start:end] += ds * _wide(k[:, :, start:end])
                dkeys[j][:, :, start:end] = (ds * _wide(qb)).to(k.dtype)
        grads = [dq, dk0, dv0, *dkeys, *dvalues]
        return (None, *(g.to(t.dtype) for g, t in zip(grads, [q, k0, v0, *later], strict=True)))


def ttt_attention(q: torch.Tensor, cache: KVCache, scale: float | None = None) -> torch.Tensor:
    """Attention of the newest step's queries q [B, nh, T, hd] over `cache`; -> [B, nh, T, hd_v].

    Equal to the dense reference, in memory linear in T (see the module docstring)."""
    (k0, v0), later = cache[0], cache[1:]
    scale = default_scale(q) if scale is None else float(scale)
    with torch.autocast(q.device.type, enabled=False):  # the function casts explicitly, like the reference
        return _LinearTTTAttention.apply(scale, q, k0, v0, *[k for k, _ in later], *[v for _, v in later])
