"""The draft model: shapes from the target, shifts, and no look-ahead (attention: test_draft_attention)."""

from __future__ import annotations

import pytest
import torch

from eagle3_pipeline.draft.model import Eagle3Draft, shift_left
from eagle3_pipeline.draft_config import attention_shape, draft_config_from_target

TARGET = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 50,
    "intermediate_size": 48,
}


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


KIMI_K25_TEXT = {  # Kimi-K2.5's text_config (DeepseekV3, multi-head latent attention): no head_dim
    "hidden_size": 7168,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "vocab_size": 163840,
    "intermediate_size": 18432,
}


@pytest.mark.parametrize(
    ("target", "settings", "expected"),
    [
        # the target's own head_dim and heads (the demo target: 2 heads of 64)
        ({"hidden_size": 128, "num_attention_heads": 2, "head_dim": 64}, {}, (64, 2, 2)),
        # Llama-3-8B's config.json has no head_dim: 4096 / 32 = 128, GQA kept
        ({"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8}, {}, (128, 32, 8)),
        # an MLA target gives no Llama head size: heads of 128 (not 7168 / 64 = 112)
        (KIMI_K25_TEXT, {}, (128, 56, 56)),
        # the production example: SpecForge's Kimi-K2.5 draft, 64 heads of 128
        (KIMI_K25_TEXT, {"head_dim": 128, "num_attention_heads": 64}, (128, 64, 64)),
        # a derived 112 is refused by FlashInfer: 128 instead
        ({"hidden_size": 7168, "num_attention_heads": 64}, {}, (128, 56, 56)),
    ],
)
def test_attention_shape_defaults_and_settings(target, settings, expected):
    assert attention_shape(target, **settings) == expected


def test_an_attention_shape_that_does_not_fit_names_the_key_to_set():
    with pytest.raises(ValueError, match=r"draft\.num_attention_heads"):
        attention_shape({"hidden_size": 200, "num_attention_heads": 2, "kv_lora_rank": 8})
    with pytest.raises(ValueError, match=r"draft\.num_key_value_heads"):
        attention_shape(KIMI_K25_TEXT, num_attention_heads=64, num_key_value_heads=48)


def test_a_draft_with_more_query_width_than_hidden_runs():
    config = draft_config_from_target(KIMI_K25_TEXT | {"hidden_size": 64, "vocab_size": 50}, 50, 32, 4, 2)
    assert (config.head_dim, config.num_attention_heads, config.num_key_value_heads) == (32, 4, 2)
    model = Eagle3Draft(config)
    assert model.midlayer.self_attn.q_proj.weight.shape == (128, 128)  # 4 x 32 from 2H
    logits = model(torch.randn(1, 5, 192), torch.randint(0, 50, (1, 5)), steps=2)
    assert logits[1].shape == (1, 5, 50)
