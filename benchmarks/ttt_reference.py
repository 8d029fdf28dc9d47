"""The quadratic references of the draft's training math, which the package's linear-memory forms
equal up to rounding: the unit tests check that (tests/unit/test_draft_attention.py, test_draft_mla.py,
test_draft_loss.py) and training.py measures both, the references as the "before".

- `ttt_attention_mask` + `ttt_attention_dense`: TTT attention with a dense T x T causal score block per
  step (draft/attention.py's module docstring; the package trains with `attention.ttt_attention`, in
  memory linear in T). `Eagle3Draft(config, attention=ttt_attention_dense)` runs the draft on it.
- `target_distribution` + `ttt_loss`: the loss from the target's [B, T, Vd] fp32 probabilities and
  every step's logits (draft/ttt.py's module docstring; the package trains with
  `target_in_draft` + `chunked_ttt_loss`, which hold nothing of vocabulary size for backward).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eagle3_pipeline.draft import attention, ttt
from eagle3_pipeline.draft.attention import KVCache
from eagle3_pipeline.draft.ttt import Batch


def ttt_attention_mask(seq_len: int, step: int) -> torch.Tensor:
    """Which keys a query of TTT step `step` may see: bool [T, T * (step + 1)] over the keys of steps
    0..step laid side by side. Step 0's block is causal; each later step's block is the identity (the
    key the same position produced at that step)."""
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    same_position = torch.eye(seq_len, dtype=torch.bool)
    return torch.cat([causal] + [same_position] * step, dim=1)


def ttt_attention_dense(q: torch.Tensor, cache: KVCache, scale: float | None = None) -> torch.Tensor:
    """The reference: attention of the newest step's queries q [B, nh, T, hd] over `cache` with a dense
    T x T causal block per step; -> [B, nh, T, hd_v]. Memory quadratic in T."""
    seq_len, scale = q.shape[-2], attention.default_scale(q) if scale is None else scale
    k0, v0 = cache[0]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).tril()
    scores = (q @ k0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # [B, nh, T, T]
    diagonal = [(q * k).sum(-1, keepdim=True) * scale for k, _ in cache[1:]]  # each [B, nh, T, 1]
    probs = torch.softmax(torch.cat([scores, *diagonal], dim=-1).float(), dim=-1).to(q.dtype)
    out = probs[..., :seq_len] @ v0
    for j, (_, v) in enumerate(cache[1:]):
        out = out + probs[..., seq_len + j : seq_len + j + 1] * v
    return out


@torch.no_grad()
def target_distribution(
    final_hidden_states: torch.Tensor, lm_head: torch.Tensor, t2d: torch.Tensor, draft_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """final [B, T, H] -> (probabilities over the draft vocab [B, T, Vd] fp32, argmax-in-draft [B, T]).

    lm_head [V, H] is the target's; t2d [V] bool; draft_ids [Vd] the target id of each draft id.
    """
    flat = final_hidden_states.reshape(-1, final_hidden_states.shape[-1])
    probs, in_draft = [], []
    for rows in flat.split(ttt.HEAD_CHUNK_ROWS):
        logits = (rows.to(lm_head.dtype) @ lm_head.T).float()  # [n, V], in the head's dtype (bf16 on GPU)
        in_draft.append(t2d[logits.argmax(-1)])
        probs.append(torch.softmax(logits[:, draft_ids], dim=-1))  # [n, Vd]
    shape = final_hidden_states.shape[:-1]
    return torch.cat(probs).view(*shape, -1), torch.cat(in_draft).view(shape)


def ttt_loss(
    step_logits: list[torch.Tensor], batch: Batch, probs: torch.Tensor, in_draft: torch.Tensor, decay: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_k decay^k * mean soft cross-entropy of step k, stats [len(ttt.STAT_ROWS), steps] of sums).

    Only counted rows are gathered (logits and their targets), so padding and prompt rows cost nothing
    past the draft's forward. Conditional accuracy at step k counts rows whose steps 0..k-1 were all
    right: what a chain of drafts accepted so far sees.
    """
    total = step_logits[0].new_zeros((), dtype=torch.float32)
    stats = torch.zeros(len(ttt.STAT_ROWS), len(step_logits), device=step_logits[0].device)
    chain = torch.ones_like(batch.loss_mask)
    for k, logits in enumerate(step_logits):
        rows, positions = ttt.step_mask(batch, in_draft, k).nonzero(as_tuple=True)
        draft = logits[rows, positions].float()  # [n, Vd]
        target = probs[rows, positions + 1 + k]  # [n, Vd]
        loss_sum = F.cross_entropy(draft, target, reduction="sum")  # soft targets: -sum p log q
        total = total + decay**k * loss_sum / max(len(rows), 1)
        with torch.no_grad():
            correct = draft.argmax(-1) == target.argmax(-1)
            chain = ttt._step_stats(stats, k, loss_sum, correct, chain, rows, positions)
    return total, stats
