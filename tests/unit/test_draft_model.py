"""The draft model: the TTT attention mask, its fast form, shifts, and no look-ahead."""

from __future__ import annotations

import math

import torch

from eagle3_pipeline.draft.config import draft_config_from_target
from eagle3_pipeline.draft.model import Eagle3Draft, shift_left, ttt_attention, ttt_attention_mask

TARGET = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 50,
    "intermediate_size": 48,
}


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


def test_fast_attention_equals_dense_attention_under_the_mask():
    torch.manual_seed(0)
    batch, heads, seq_len, head_dim, steps = 2, 3, 5, 8, 4
    cache = [
        (torch.randn(batch, heads, seq_len, head_dim), torch.randn(batch, heads, seq_len, head_dim))
        for _ in range(steps)
    ]
    q = torch.randn(batch, heads, seq_len, head_dim)
    keys = torch.cat([k for k, _ in cache], dim=2)  # [B, nh, T * steps, hd]
    values = torch.cat([v for _, v in cache], dim=2)
    scores = (q @ keys.transpose(-1, -2)) / math.sqrt(head_dim)
    scores = scores.masked_fill(~ttt_attention_mask(seq_len, steps - 1), float("-inf"))
    dense = torch.softmax(scores, dim=-1) @ values
    torch.testing.assert_close(ttt_attention(q, cache), dense)


def test_shift_left_fills_with_zeros():
    x = torch.tensor([[1, 2, 3, 4]])
    assert shift_left(x, 0).tolist() == [[1, 2, 3, 4]]
    assert shift_left(x, 1).tolist() == [[2, 3, 4, 0]]
    assert shift_left(x, 3).tolist() == [[4, 0, 0, 0]]
    assert shift_left(x, 6).tolist() == [[0, 0, 0, 0]]


def test_draft_shape_comes_from_the_target():
    config = draft_config_from_target(TARGET | {"rope_parameters": {"rope_theta": 5e5}}, draft_vocab_size=100)
    assert (config.hidden_size, config.head_dim, config.num_key_value_heads) == (32, 8, 2)
    assert config.draft_vocab_size == 50  # capped at the target vocabulary
    assert config.rope_theta == 5e5
    model = Eagle3Draft(config)
    assert model.fc.weight.shape == (32, 96)
    assert model.midlayer.self_attn.q_proj.weight.shape == (32, 64)  # reads 2H
    assert not model.embed_tokens.weight.requires_grad
    assert "embed_tokens.weight" not in model.exported_state_dict()


def test_step_k_row_i_sees_no_token_after_i_plus_1_plus_k():
    """Row i of step k may read tokens up to i+1+k and auxiliary states up to i, nothing later."""
    torch.manual_seed(0)
    model = Eagle3Draft(draft_config_from_target(TARGET, 50)).eval()
    ids = torch.randint(0, 50, (1, 10))
    aux = torch.randn(1, 10, 96)
    base = model(aux, ids, steps=3)
    for k in range(3):
        for i in range(8 - k):
            changed_ids = ids.clone()
            changed_ids[0, i + 2 + k :] = (changed_ids[0, i + 2 + k :] + 1) % 50
            changed_aux = aux.clone()
            changed_aux[0, i + 1 :] += 1.0
            out = model(changed_aux, changed_ids, steps=3)
            torch.testing.assert_close(out[k][0, : i + 1], base[k][0, : i + 1])
        # and the token at i+1+k does matter
        changed = ids.clone()
        changed[0, 1 + k] = (changed[0, 1 + k] + 1) % 50
        assert not torch.allclose(model(aux, changed, steps=3)[k][0, 0], base[k][0, 0])
