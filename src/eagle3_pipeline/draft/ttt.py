"""Training-time-test loss and metrics: targets, masks and their shifts.

Indexing (one batch row, T tokens x_0..x_{T-1}). The target's logits at position j are
lm_head(final_hidden_states[j]) and predict x_{j+1}. The draft's row i at step k predicts x_{i+2+k}
(see Eagle3Draft.forward), so its target is the target's distribution at j = i + 1 + k, restricted to
the draft vocabulary (softmax over those ids only), and the row counts when:

    loss_mask[i + 2 + k]            the predicted token is completion text (shifted with the targets)
    target argmax at j in the draft vocabulary (otherwise the draft cannot be right, EAGLE-3)
    the final state at j was stored (shards may keep it only at loss positions)

Beyond the row's end the shifted masks are zero, so padding and the tail never count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from eagle3_pipeline.draft.model import shift_left

STAT_ROWS = ("loss_sum", "count", "correct", "cond_correct", "cond_count")
HEAD_CHUNK_ROWS = 1024  # rows of target logits at a time: [1024, V] fp32 is 670 MB at V = 163,840


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
def target_distribution(
    final_hidden_states: torch.Tensor, lm_head: torch.Tensor, t2d: torch.Tensor, draft_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """final [B, T, H] -> (probabilities over the draft vocab [B, T, Vd] fp32, argmax-in-draft [B, T]).

    lm_head [V, H] is the target's; t2d [V] bool; draft_ids [Vd] the target id of each draft id.
    """
    flat = final_hidden_states.reshape(-1, final_hidden_states.shape[-1])
    probs, in_draft = [], []
    for rows in flat.split(HEAD_CHUNK_ROWS):
        logits = (rows.to(lm_head.dtype) @ lm_head.T).float()  # [n, V], in the head's dtype (bf16 on GPU)
        in_draft.append(t2d[logits.argmax(-1)])
        probs.append(torch.softmax(logits[:, draft_ids], dim=-1))  # [n, Vd]
    shape = final_hidden_states.shape[:-1]
    return torch.cat(probs).view(*shape, -1), torch.cat(in_draft).view(shape)


def step_mask(batch: Batch, in_draft: torch.Tensor, step: int) -> torch.Tensor:
    """Rows [B, T] (bool) that count at TTT step `step`; row i targets position i + 1 + step."""
    return shift_left(in_draft & batch.has_final, 1 + step) & shift_left(batch.loss_mask, 2 + step)


def ttt_loss(
    step_logits: list[torch.Tensor], batch: Batch, probs: torch.Tensor, in_draft: torch.Tensor, decay: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_k decay^k * mean soft cross-entropy of step k, stats [len(STAT_ROWS), steps] of sums).

    Only counted rows are gathered (logits and their targets), so padding and prompt rows cost nothing
    past the draft's forward. Conditional accuracy at step k counts rows whose steps 0..k-1 were all
    right: what a chain of drafts accepted so far sees.
    """
    total = step_logits[0].new_zeros((), dtype=torch.float32)
    stats = torch.zeros(len(STAT_ROWS), len(step_logits), device=step_logits[0].device)
    chain = torch.ones_like(batch.loss_mask)
    for k, logits in enumerate(step_logits):
        rows, positions = step_mask(batch, in_draft, k).nonzero(as_tuple=True)
        draft = logits[rows, positions].float()  # [n, Vd]
        target = probs[rows, positions + 1 + k]  # [n, Vd]
        loss_sum = F.cross_entropy(draft, target, reduction="sum")  # soft targets: -sum p log q
        total = total + decay**k * loss_sum / max(len(rows), 1)
        with torch.no_grad():
            correct = draft.argmax(-1) == target.argmax(-1)
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
