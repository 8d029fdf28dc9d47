"""Captured layers against a plain transformers forward with output_hidden_states (the off-by-one)."""

from __future__ import annotations

import pytest
import torch
from support.hidden_states import trace_rows
from transformers import AutoModelForCausalLM

from eagle3_pipeline.hidden_states import capture
from eagle3_pipeline.hidden_states.sequences import resolve_layers
from eagle3_pipeline.target_shape import vllm_layer_ids


@pytest.fixture(scope="module")
def fp32_model(hs_target):
    return AutoModelForCausalLM.from_pretrained(str(hs_target), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def seqs(hs_tokenizer):
    return [r["prompt_token_ids"] + r["completion_token_ids"] for r in trace_rows(hs_tokenizer, 4)]


@torch.inference_mode()
def reference(model, ids):
    """HF: hidden_states[0] = embeddings, [l+1] = output of decoder layer l, [N] = after the final norm."""
    return model(torch.tensor([ids]), output_hidden_states=True).hidden_states


def test_aux_layers_equal_hf_hidden_states_at_l_plus_1(fp32_model, seqs):
    n = fp32_model.config.num_hidden_layers
    layers = resolve_layers("auto", n)
    h = fp32_model.config.hidden_size
    (aux, _), *_ = capture.capture_batch(fp32_model, [seqs[0]], layers, torch.float32)
    hs = reference(fp32_model, seqs[0])
    assert len(hs) == n + 1
    for k, (layer, vllm_id) in enumerate(zip(layers, vllm_layer_ids(layers), strict=True)):
        block = aux[:, k * h : (k + 1) * h]
        torch.testing.assert_close(block, hs[layer + 1][0], rtol=1e-5, atol=1e-5)  # ours: output of layer l
        torch.testing.assert_close(block, hs[vllm_id][0], rtol=1e-5, atol=1e-5)  # vLLM: input of layer l+1
        assert not torch.allclose(block, hs[layer][0], atol=1e-3)  # the off-by-one is visible
        assert not torch.allclose(block, hs[layer + 2][0], atol=1e-3)


def test_final_state_is_post_norm(fp32_model, seqs):
    n = fp32_model.config.num_hidden_layers
    ((_, final),) = capture.capture_batch(fp32_model, [seqs[1]], [n - 1, 1, 2], torch.float32)
    hs = reference(fp32_model, seqs[1])
    torch.testing.assert_close(final, hs[n][0], rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        logits = fp32_model.lm_head(final)
        torch.testing.assert_close(
            logits, fp32_model(torch.tensor([seqs[1]])).logits[0], rtol=1e-4, atol=1e-4
        )
    ((aux, _),) = capture.capture_batch(fp32_model, [seqs[1]], [1, 2, n - 1], torch.float32)
    pre_norm = aux[:, -fp32_model.config.hidden_size :]  # raw output of the last layer
    assert not torch.allclose(pre_norm, final, atol=1e-3)
    with torch.inference_mode():
        torch.testing.assert_close(fp32_model.model.norm(pre_norm), final, rtol=1e-5, atol=1e-5)


def test_padded_batch_equals_one_by_one(fp32_model, seqs):
    layers = [1, 3, 4]
    batched = capture.capture_batch(fp32_model, seqs, layers, torch.float32)
    for ids, (aux, final) in zip(seqs, batched, strict=True):
        ((aux1, final1),) = capture.capture_batch(fp32_model, [ids], layers, torch.float32)
        assert aux.shape == (len(ids), 3 * fp32_model.config.hidden_size)
        torch.testing.assert_close(aux, aux1, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(final, final1, rtol=1e-4, atol=1e-4)


def test_storage_dtype_and_hooks_removed(fp32_model, seqs):
    _, layers = capture.decoder_parts(fp32_model)
    before = [len(layer._forward_hooks) for layer in layers]  # transformers keeps hooks of its own
    ((aux, final),) = capture.capture_batch(fp32_model, [seqs[0]], [1, 3, 4], torch.bfloat16)
    assert aux.dtype == final.dtype == torch.bfloat16
    assert [len(layer._forward_hooks) for layer in layers] == before


def test_bf16_compute_is_close_to_fp32(hs_target, fp32_model, seqs):
    bf16 = capture.load_target(hs_target, torch.bfloat16, torch.device("cpu"), device_map=False)
    ((aux, final),) = capture.capture_batch(bf16, [seqs[2]], [1, 3, 4], torch.float32)
    ((aux32, final32),) = capture.capture_batch(fp32_model, [seqs[2]], [1, 3, 4], torch.float32)
    rel = (final - final32).norm() / final32.norm()
    assert rel < 0.05, f"bf16 final state {rel:.3f} away from fp32"
    assert (aux - aux32).norm() / aux32.norm() < 0.05
