"""The training path (chunked soft cross-entropy over the draft's hidden states, each TTT step
checkpointed) against the reference (whole-batch target probabilities, every step's logits, F.cross_entropy):
the same loss, statistics and gradients at the demo draft's shape."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from eagle3_pipeline.draft import ttt
from eagle3_pipeline.draft.model import Eagle3Draft
from eagle3_pipeline.draft.ttt import Batch, chunked_ttt_loss, target_in_draft
from eagle3_pipeline.draft_config import draft_config_from_target

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the references

from ttt_reference import target_distribution, ttt_loss  # noqa: E402

# the demo target (demo/fit.py): hidden 128, 2 heads of 64, MLP 384, vocabulary 1,024
DEMO = {"hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 384, "vocab_size": 1024}


def demo_case(draft_vocab: int = 600, seq_len: int = 96, batch: int = 2):
    config = draft_config_from_target(DEMO, draft_vocab)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randperm(config.vocab_size, generator=generator)[:draft_vocab].sort().values
    t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    lm_head = torch.randn(config.vocab_size, 128, generator=generator) / 4
    head = {"lm_head": lm_head, "t2d": t2d, "draft_ids": ids}
    data = Batch(
        input_ids=torch.randint(0, config.vocab_size, (batch, seq_len), generator=generator),
        loss_mask=torch.rand(batch, seq_len, generator=generator) < 0.8,
        aux_hidden_states=torch.randn(batch, seq_len, 3 * 128, generator=generator),
        final_hidden_states=torch.randn(batch, seq_len, 128, generator=generator),
        has_final=torch.rand(batch, seq_len, generator=generator) < 0.9,
    )
    data.loss_mask[1, seq_len // 2 :] = False  # a padded row
    torch.manual_seed(0)
    return config, head, data


def reference(model: Eagle3Draft, head: dict, data: Batch, steps: int):
    probs, in_draft = target_distribution(data.final_hidden_states, **head)
    return ttt_loss(model(data.aux_hidden_states, data.input_ids, steps), data, probs, in_draft, 0.8)


def chunked(model: Eagle3Draft, head: dict, data: Batch, steps: int):
    in_draft = target_in_draft(data.final_hidden_states, head["lm_head"], head["t2d"])
    hidden = model.hidden_states(data.aux_hidden_states, data.input_ids, steps)
    target_head = head["lm_head"][head["draft_ids"]]
    return chunked_ttt_loss(hidden, model.lm_head.weight, data, target_head, in_draft, 0.8)


def grads(model: torch.nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}


# one row per chunk on shorter rows: 336 chunks (each its own forward and backward) instead of 1,344
@pytest.mark.parametrize(
    ("checkpointing", "chunk_elements", "seq_len"), [(False, 2**25, 96), (True, 600 * 7, 96), (True, 1, 24)]
)
def test_chunked_loss_and_gradients_equal_the_reference(monkeypatch, checkpointing, chunk_elements, seq_len):
    config, head, data = demo_case(seq_len=seq_len)
    model = Eagle3Draft(config)
    loss_ref, stats_ref = reference(model, head, data, 7)
    grads_ref = grads(model, loss_ref)
    monkeypatch.setattr(ttt, "LOSS_CHUNK_ELEMENTS", chunk_elements)  # 7 rows per chunk, or one
    model.checkpointing = checkpointing
    loss, stats = chunked(model, head, data, 7)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats, stats_ref, rtol=1e-5, atol=1e-4)
    assert stats[1].min() > 0  # every step counts rows
    for name, grad in grads(model, loss).items():
        torch.testing.assert_close(grad, grads_ref[name], rtol=1e-4, atol=1e-6, msg=name)


def test_under_bf16_autocast_the_chunked_loss_is_as_close_to_fp32_as_the_reference():
    config, head, data = demo_case(seq_len=64)
    model = Eagle3Draft(config)
    exact = grads(model, reference(model, head, data, 3)[0])
    errors = []
    for loss_of in (reference, chunked):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = loss_of(model, head, data, 3)
        got = grads(model, loss)
        errors.append(max(((got[n] - exact[n]).norm() / exact[n].norm()).item() for n in exact))
    assert errors[1] <= 2 * errors[0] + 1e-3, errors


def test_target_in_draft_is_the_reference_mask():
    _, head, data = demo_case()
    _, in_draft = target_distribution(data.final_hidden_states, **head)
    assert torch.equal(target_in_draft(data.final_hidden_states, head["lm_head"], head["t2d"]), in_draft)
