"""TTT attention: the mask, the dense reference against it, and the linear-memory form against the
reference in forward and gradients (fp32, several T, steps, heads, with several query blocks)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from eagle3_pipeline.draft import attention
from eagle3_pipeline.draft.attention import ttt_attention
from eagle3_pipeline.draft.model import Eagle3Draft
from eagle3_pipeline.draft_config import draft_config_from_target

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the references

from ttt_reference import ttt_attention_dense, ttt_attention_mask  # noqa: E402


def random_cache(batch, heads, seq_len, head_dim, steps, dtype=torch.float32):
    def one():
        return torch.randn(batch, heads, seq_len, head_dim, dtype=dtype, requires_grad=True)

    return one(), [(one(), one()) for _ in range(steps)]


def test_mask_is_causal_over_step_zero_and_diagonal_over_later_steps():
    expected = torch.tensor(
        [
            # step 0 keys   step 1 keys   step 2 keys
            [1, 0, 0, 1, 0, 0, 1, 0, 0],
            [1, 1, 0, 0, 1, 0, 0, 1, 0],
            [1, 1, 1, 0, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(ttt_attention_mask(3, 2), expected)
    assert torch.equal(ttt_attention_mask(3, 0), expected[:, :3])


def test_dense_reference_equals_attention_under_the_mask():
    torch.manual_seed(0)
    q, cache = random_cache(2, 3, 5, 8, 4)
    keys = torch.cat([k for k, _ in cache], dim=2)  # [B, nh, T * steps, hd]
    values = torch.cat([v for _, v in cache], dim=2)
    scores = (q @ keys.transpose(-1, -2)) / math.sqrt(8)
    scores = scores.masked_fill(~ttt_attention_mask(5, 3), float("-inf"))
    torch.testing.assert_close(ttt_attention_dense(q, cache), torch.softmax(scores, dim=-1) @ values)


@pytest.mark.parametrize(
    ("seq_len", "steps", "heads", "block_elements"),
    [(1, 1, 1, 2**25), (7, 1, 2, 2**25), (37, 3, 2, 16 * 37 * 2 * 2), (64, 7, 4, 2**25), (100, 7, 3, 1)],
)
def test_linear_attention_equals_the_dense_reference_in_forward_and_gradients(
    monkeypatch, seq_len, steps, heads, block_elements
):
    # block_elements small enough forces many query blocks (of MIN_BLOCK_ROWS, 16 here)
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", block_elements)
    monkeypatch.setattr(attention, "MIN_BLOCK_ROWS", 16)
    torch.manual_seed(seq_len + steps)
    q, cache = random_cache(2, heads, seq_len, 16, steps)
    grad = torch.randn(2, heads, seq_len, 16)
    leaves = [q] + [t for kv in cache for t in kv]
    dense = ttt_attention_dense(q, cache)
    dense_grads = torch.autograd.grad(dense, leaves, grad)
    linear = ttt_attention(q, cache)
    linear_grads = torch.autograd.grad(linear, leaves, grad)
    torch.testing.assert_close(linear, dense, rtol=1e-5, atol=1e-6)
    for got, want in zip(linear_grads, dense_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_linear_attention_passes_gradcheck_in_float64(monkeypatch):
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 1)  # blocks of 4 rows over 6: two blocks, one partial
    monkeypatch.setattr(attention, "MIN_BLOCK_ROWS", 4)
    torch.manual_seed(1)
    q, cache = random_cache(1, 2, 6, 4, 3, dtype=torch.float64)  # small: gradcheck perturbs every element

    def fn(q, *flat):
        return ttt_attention(q, list(zip(flat[0::2], flat[1::2], strict=True)))

    assert torch.autograd.gradcheck(fn, (q, *[t for kv in cache for t in kv]))


def test_bf16_linear_attention_is_as_close_to_fp32_as_the_reference():
    torch.manual_seed(2)
    q, cache = random_cache(1, 2, 48, 32, 4)
    exact = ttt_attention_dense(q, cache)
    q16, cache16 = q.bfloat16(), [(k.bfloat16(), v.bfloat16()) for k, v in cache]
    error_dense = (ttt_attention_dense(q16, cache16).float() - exact).abs().max()
    error_linear = (ttt_attention(q16, cache16).float() - exact).abs().max()
    assert error_linear <= 2 * error_dense + 1e-3


def test_the_draft_trains_alike_with_either_attention():
    target = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
    config = draft_config_from_target(target | {"intermediate_size": 48, "vocab_size": 50}, 50)
    torch.manual_seed(0)
    linear = Eagle3Draft(config)
    dense = Eagle3Draft(config, attention=ttt_attention_dense)
    dense.load_state_dict(linear.state_dict())
    ids, aux = torch.randint(0, 50, (2, 30)), torch.randn(2, 30, 96)
    losses = []
    for model in (linear, dense):
        step_logits = model(aux, ids, steps=5)
        loss = sum((0.8**k) * logits.logsumexp(-1).mean() for k, logits in enumerate(step_logits))
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[0], losses[1])
    for (name, a), b in zip(linear.named_parameters(), dense.parameters(), strict=True):
        if a.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)
