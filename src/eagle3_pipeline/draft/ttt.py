"""Training-time-test loss and metrics: targets, masks and their shifts.

Indexing (one batch row, T tokens x_0..x_{T-1}). The target's logits at position j are
lm_head(final_hidden_states[j]) and predict x_{j+1}. The draft's row i at step k predicts x_{i+2+k}
(see Eagle3Draft.forward), so its target is the target's distribution at j = i + 1 + k, restricted to
the draft vocabulary (softmax over those ids only), and the row counts when:

    loss_mask[i + 2 + k]            the predicted token is completion text (shifted with the targets)
    target argmax at j in the draft vocabulary (otherwise the draft cannot be right, EAGLE-3)
    the final state at j was stored (shards may keep it only at loss positions)

Beyond the row's end the shifted masks are zero, so padding and the tail never count.

Two forms of the loss, equal up to rounding (tests/unit/test_draft_loss.py):

- the reference, `target_distribution` + `ttt_loss` in benchmarks/ttt_reference.py (the tests and the
  training benchmark's "before"; not in the package): the target's probabilities over the draft
  vocabulary for the whole batch ([B, T, Vd] fp32) and every step's logits, gathered at the counted
  rows in fp32 and kept for backward by the cross-entropy ([n, Vd] fp32 per step).
- `target_in_draft` + `chunked_ttt_loss` (training): the draft's normed hidden states and its lm_head
  go in, and `SoftCrossEntropy` computes logits, target probabilities (from the target's lm_head rows
  of the draft vocabulary) and their cross-entropy LOSS_CHUNK_ELEMENTS scores at a time, keeping
  nothing of vocabulary size for backward: the backward pass recomputes each chunk's softmax and
  turns it into gradients (softmax(logits) - p) at once, like a fused (Liger, SpecForge) kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle3_pipeline.draft.model import shift_left

STAT_ROWS = ("loss_sum", "count", "correct", "cond_correct", "cond_count")
HEAD_CHUNK_ROWS = 1024  # rows of target logits at a time: [1024, V] fp32 is 670 MB at V = 163,840
LOSS_CHUNK_ELEMENTS = 2**25  # scores per loss chunk: 128 MB in fp32 (1,048 rows at Vd = 32,000)


@dataclass
class Batch:
    """A padded batch of whole samples."""

    input_ids: torch.Tensor  # [B, T] int64
    loss_mask: torch.Tensor  # [B, T] bool, 1 over completion tokens
    aux_hidden_states: torch.Tensor  # [B, T, 3H]
    final_hidden_states: torch.Tensor  # [B, T, H], post-norm
    has_final: torch.Tensor  # [B, T] bool: final_hidden_states[b, t] was stored

    def to(self, device: torch.device) -> Batch:
        return Batch(**{k: v.to(device, non_blocking=True) for k, v in vars(self).items()})

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.shape[0] * self.loss_mask.shape[1])


@torch.no_grad()
def target_in_draft(
    final_hidden_states: torch.Tensor, lm_head: torch.Tensor, t2d: torch.Tensor
) -> torch.Tensor:
    """final [B, T, H] -> bool [B, T]: the target's argmax at each row is in the draft vocabulary.

    Chunked over rows; the argmax is taken in the head's dtype (its fp32 copy has the same argmax)."""
    flat = final_hidden_states.reshape(-1, final_hidden_states.shape[-1])
    in_draft = [t2d[(rows.to(lm_head.dtype) @ lm_head.T).argmax(-1)] for rows in flat.split(HEAD_CHUNK_ROWS)]
    return torch.cat(in_draft).view(final_hidden_states.shape[:-1])


def chunk_rows(vocab: int) -> int:
    return max(1, LOSS_CHUNK_ELEMENTS // max(1, vocab))


class SoftCrossEntropy(torch.autograd.Function):
    """sum over rows of -sum_v p log softmax(hidden @ weight.T), p = softmax(final @ target_head.T), by
    chunks of rows; see the module docstring. The rows are hidden[rows] and final[target_rows] (flat
    [N, H] tensors and index vectors, so no gathered copy is kept); matmuls run in `dtype`, softmaxes
    in fp32. Returns (loss sum, the draft's argmax per row, the target's argmax per row)."""

    @staticmethod
    def forward(ctx, hidden, weight, rows, final, target_rows, target_head, dtype):  # noqa: ANN001
        chunk = chunk_rows(weight.shape[0])
        weight_c, head_c = weight.to(dtype), target_head.to(dtype)
        loss = hidden.new_zeros((), dtype=torch.float32)
        draft_top, target_top = [], []
        for start in range(0, len(rows), chunk):
            logits, probs = _chunk(hidden, weight_c, rows, final, target_rows, head_c, dtype, start, chunk)
            loss = loss - (probs * torch.log_softmax(logits, dim=-1)).sum()
            draft_top.append(logits.argmax(-1))
            target_top.append(probs.argmax(-1))
        ctx.save_for_backward(hidden, weight, rows, final, target_rows, target_head)
        ctx.dtype = dtype
        empty = rows.new_zeros(0)
        tops = (torch.cat(draft_top) if draft_top else empty, torch.cat(target_top) if target_top else empty)
        ctx.mark_non_differentiable(*tops)
        return loss, *tops

    @staticmethod
    def backward(ctx, grad_loss, *_):  # noqa: ANN001
        hidden, weight, rows, final, target_rows, target_head = ctx.saved_tensors
        dtype, chunk = ctx.dtype, chunk_rows(weight.shape[0])
        weight_c, head_c = weight.to(dtype), target_head.to(dtype)
        grad_hidden = torch.zeros_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.promote_types(weight.dtype, torch.float32))
        for start in range(0, len(rows), chunk):
            logits, probs = _chunk(hidden, weight_c, rows, final, target_rows, head_c, dtype, start, chunk)
            # d/dlogits of -sum p log softmax(logits) = softmax(logits) * sum(p) - p
            grad = (torch.softmax(logits, -1) * probs.sum(-1, keepdim=True) - probs) * grad_loss
            grad = grad.to(dtype)
            index = rows[start : start + chunk]
            grad_hidden.index_add_(0, index, (grad @ weight_c).to(hidden.dtype))
            grad_weight += grad.T @ hidden[index].to(dtype)
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None, None, None


def _chunk(hidden, weight, rows, final, target_rows, target_head, dtype, start, chunk):  # noqa: ANN001, ANN202
    """(draft logits, target probabilities) of rows start..start+chunk-1, both fp32 [C, Vd]."""
    index, target_index = rows[start : start + chunk], target_rows[start : start + chunk]
    logits = (hidden[index].to(dtype) @ weight.T).float()
    probs = torch.softmax((final[target_index].to(dtype) @ target_head.T).float(), dim=-1)
    return logits, probs


def step_mask(batch: Batch, in_draft: torch.Tensor, step: int) -> torch.Tensor:
    """Rows [B, T] (bool) that count at TTT step `step`; row i targets position i + 1 + step."""
    return shift_left(in_draft & batch.has_final, 1 + step) & shift_left(batch.loss_mask, 2 + step)


def _step_stats(stats, k, loss_sum, correct, chain, rows, positions) -> torch.Tensor:  # noqa: ANN001
    """Fill stats[:, k]; -> the chain of rows whose steps 0..k were all right."""
    before = chain[rows, positions]
    stats[:, k] = torch.stack(
        [
            loss_sum.detach(),
            torch.tensor(float(len(rows)), device=stats.device),
            correct.sum(),
            (correct & before).sum(),
            before.sum(),
        ]
    ).float()
    chain = torch.zeros_like(chain)
    chain[rows, positions] = correct & before
    return chain


def chunked_ttt_loss(
    step_hidden: list[torch.Tensor],
    lm_head: torch.Tensor,
    batch: Batch,
    target_head: torch.Tensor,
    in_draft: torch.Tensor,
    decay: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's `ttt_loss` (module docstring) of the logits lm_head(step_hidden[k]), without
    holding any [T, Vd] logits or target probabilities: step_hidden are the draft's normed outputs
    [B, T, H] (Eagle3Draft.hidden_states), lm_head its head's weight [Vd, H], target_head the target's lm_head
    rows of the draft vocabulary [Vd, H] (lm_head[draft_ids]). Matmuls run in the autocast dtype when
    autocast is on (as the reference's nn.Linear does), else in the draft's dtype."""
    device = step_hidden[0].device
    dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else lm_head.dtype
    total = torch.zeros((), dtype=torch.float32, device=device)
    stats = torch.zeros(len(STAT_ROWS), len(step_hidden), device=device)
    chain = torch.ones_like(batch.loss_mask)
    final = batch.final_hidden_states.reshape(-1, batch.final_hidden_states.shape[-1])
    seq_len = batch.loss_mask.shape[1]
    for k, hidden in enumerate(step_hidden):
        rows, positions = step_mask(batch, in_draft, k).nonzero(as_tuple=True)
        flat_rows = rows * seq_len + positions
        with torch.autocast(device.type, enabled=False):  # the Function casts explicitly
            flat = hidden.reshape(-1, hidden.shape[-1])
            loss_sum, draft_top, target_top = SoftCrossEntropy.apply(
                flat, lm_head, flat_rows, final, flat_rows + 1 + k, target_head, dtype
            )
        total = total + decay**k * loss_sum / max(len(rows), 1)
        with torch.no_grad():
            chain = _step_stats(stats, k, loss_sum, draft_top == target_top, chain, rows, positions)
    return total, stats


def summarize(stats: torch.Tensor, decay: float) -> dict[str, float | list[float]]:
    """Per-step loss, accuracy and conditional accuracy from summed stats; the weighted loss; and the
    simulated acceptance length 1 + sum_k prod_{j<=k} conditional_accuracy_j."""
    rows = dict(zip(STAT_ROWS, stats.double().cpu(), strict=True))
    loss = (rows["loss_sum"] / rows["count"].clamp(min=1)).tolist()
    accuracy = (rows["correct"] / rows["count"].clamp(min=1)).tolist()
    conditional = (rows["cond_correct"] / rows["cond_count"].clamp(min=1)).tolist()
    acceptance, run = 1.0, 1.0
    for c in conditional:
        run *= c
        acceptance += run
    return {
        "loss": sum(decay**k * x for k, x in enumerate(loss)),
        "step_loss": loss,
        "step_accuracy": accuracy,
        "conditional_accuracy": conditional,
        "simulated_acceptance_length": acceptance,
        "tokens": int(rows["count"][0]),
    }
