"""The MLA draft (draft.architecture deepseek_mla): which targets get it, its shape at Kimi-K2.5's
dimensions, its attention exact against a dense float64 reference under the TTT mask (forward and
gradients, with and without a q LoRA), step 0 equal to transformers' DeepseekV3Attention with YaRN, and
an export whose tensors are the ones vLLM 0.32's Eagle3DeepseekV3ForCausalLM maps onto its parameters."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eagle3_pipeline.draft import attention
from eagle3_pipeline.draft.attention import ttt_attention
from eagle3_pipeline.draft.export import (
    MLA_ARCHITECTURE,
    SPECULATORS_REFUSAL,
    check_tensors,
    checkpoint_config,
    expected_keys,
    export_checkpoint,
    speculators_config,
)
from eagle3_pipeline.draft.mla import MLAAttention, mla_scale
from eagle3_pipeline.draft.model import Eagle3Draft
from eagle3_pipeline.draft.vocab import build_vocab_map
from eagle3_pipeline.draft_config import DraftConfig, draft_config_from_target, read_target_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the references

from ttt_reference import ttt_attention_dense, ttt_attention_mask  # noqa: E402

YARN = {
    "type": "yarn",
    "factor": 64.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 1.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
KIMI_K25_TEXT = {  # Kimi-K2.5's text_config (DeepseekV3)
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 163840,
    "max_position_embeddings": 262144,
    "rope_theta": 50000.0,
    "rope_scaling": YARN,
}
# Kimi's proportions scaled down: queries and keys nope + rope = 24 + 8 = 32 wide, values 16
SMALL = KIMI_K25_TEXT | {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 48,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 24,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "vocab_size": 80,
    "max_position_embeddings": 1024,
    "rope_scaling": YARN | {"factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32.0},
}
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2, "head_dim": 32, "vocab_size": 80}


@pytest.mark.parametrize("model_type", ["deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25"])
def test_auto_is_mla_for_the_deepseek_and_kimi_family(model_type):
    assert draft_config_from_target(SMALL | {"model_type": model_type}, 40).architecture == "deepseek_mla"


def test_auto_is_llama_otherwise_and_either_can_be_forced():
    assert draft_config_from_target(LLAMA, 40).architecture == "llama"
    assert draft_config_from_target(SMALL, 40, head_dim=32, architecture="llama").architecture == "llama"
    assert draft_config_from_target(SMALL | {"model_type": "x"}, 40, architecture="deepseek_mla").kv_lora_rank
    with pytest.raises(
        ValueError, match=r"draft.architecture deepseek_mla .*kv_lora_rank.*set draft.architecture"
    ):
        draft_config_from_target(LLAMA, 40, architecture="deepseek_mla")
    # a Llama head asked for (the Kimi example's 64 heads of 128) keeps auto on llama
    assert draft_config_from_target(KIMI_K25_TEXT, 40, 128, 64, 64).architecture == "llama"
    with pytest.raises(ValueError, match="leave draft.head_dim"):
        draft_config_from_target(KIMI_K25_TEXT, 40, 128, architecture="deepseek_mla")
    with pytest.raises(ValueError, match=r"has no \['qk_nope_head_dim', 'v_head_dim'\]"):
        draft_config_from_target(
            {k: v for k, v in SMALL.items() if k not in ("qk_nope_head_dim", "v_head_dim")}, 40
        )
    with pytest.raises(ValueError, match="draft.architecture 'mla'"):
        draft_config_from_target(SMALL, 40, architecture="mla")


def test_a_multimodal_wrapper_is_read_through_its_text_config(tmp_path):
    text = {k: v for k, v in SMALL.items() if k != "model_type"}  # the wrapper's type decides
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kimi_k25", "text_config": text}))
    assert draft_config_from_target(read_target_config(tmp_path), 40).architecture == "deepseek_mla"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kimi_k25", "text_config": SMALL}))
    assert read_target_config(tmp_path)["model_type"] == "deepseek_v3"


def test_the_kimi_shape_is_the_targets_own_mla():
    config = draft_config_from_target(KIMI_K25_TEXT, 32000)
    assert (config.q_lora_rank, config.kv_lora_rank, config.num_attention_heads) == (1536, 512, 64)
    assert (config.qk_head_dim, config.v_head_dim, config.head_dim) == (192, 128, 64)
    assert config.rope_scaling == {"rope_type": "yarn"} | {k: v for k, v in YARN.items() if k != "type"}
    # the latent and the rope key: what vLLM caches per token, against 64 x 128 keys and values for Llama
    assert 2 * (config.kv_lora_rank + config.qk_rope_head_dim) == 1152
    assert mla_scale(config) == pytest.approx(192**-0.5 * (0.1 * torch.tensor(64.0).log().item() + 1) ** 2)
    with pytest.raises(ValueError, match="leave draft.head_dim and draft.num_key_value_heads null"):
        draft_config_from_target(KIMI_K25_TEXT, 32000, head_dim=128, architecture="deepseek_mla")
    with pytest.raises(ValueError, match="draft.norm_before_fc is not served for an MLA draft"):
        draft_config_from_target(KIMI_K25_TEXT, 32000, norm_before_fc=True)
    with pytest.raises(ValueError, match="not YaRN"):
        draft_config_from_target(KIMI_K25_TEXT | {"rope_scaling": {"type": "linear", "factor": 2.0}}, 32000)


def interleaved_rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rope as the complex rotation of pairs (x0 + i x1, x2 + i x3, ...) by the module's own tables (their
    YaRN values are checked against transformers below): independent of the module's stacking."""
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    rotation = torch.complex(cos[..., ::2].double(), sin[..., ::2].double())
    return torch.view_as_real(pairs * rotation).flatten(-2)


def mla_reference(module: MLAAttention, xs: list[torch.Tensor]) -> torch.Tensor:
    """Dense float64 attention of the last step's queries over every step's keys under the TTT mask,
    q, k, v computed from the module's weights by einsum (the norms and rope tables are the module's)."""
    c, t = module.config, xs[0].shape[1]
    cos, sin = module.rotary(torch.arange(t)[None].expand(xs[0].shape[0], -1))

    def qkv(x):
        w = module.q_b_proj.weight if c.q_lora_rank else module.q_proj.weight
        low = (
            module.q_a_layernorm(torch.einsum("btw,rw->btr", x, module.q_a_proj.weight))
            if c.q_lora_rank
            else x
        )
        q = torch.einsum("btr,qr->btq", low, w).view(*x.shape[:2], c.num_attention_heads, -1).transpose(1, 2)
        a = torch.einsum("btw,lw->btl", x, module.kv_a_proj_with_mqa.weight)
        latent, k_rope = a[..., : c.kv_lora_rank], a[..., c.kv_lora_rank :]
        kv = torch.einsum("btl,kl->btk", module.kv_a_layernorm(latent), module.kv_b_proj.weight)
        kv = kv.view(*x.shape[:2], c.num_attention_heads, -1).transpose(1, 2)
        k_rope = interleaved_rope_reference(k_rope[:, None], cos, sin)
        q_rope = interleaved_rope_reference(q[..., c.qk_nope_head_dim :], cos, sin)
        k = torch.cat([kv[..., : c.qk_nope_head_dim], k_rope.expand(-1, c.num_attention_heads, -1, -1)], -1)
        return torch.cat([q[..., : c.qk_nope_head_dim], q_rope], -1), k, kv[..., c.qk_nope_head_dim :]

    steps = [qkv(x) for x in xs]
    q = steps[-1][0]
    keys, values = torch.cat([k for _, k, _ in steps], 2), torch.cat([v for _, _, v in steps], 2)
    scores = (q @ keys.transpose(-1, -2)) * mla_scale(c)
    scores = scores.masked_fill(~ttt_attention_mask(t, len(xs) - 1), float("-inf"))
    out = (torch.softmax(scores, -1) @ values).transpose(1, 2).reshape(*xs[0].shape[:2], -1)
    return torch.einsum("btv,hv->bth", out, module.o_proj.weight)


@pytest.mark.parametrize("q_lora_rank", [48, None], ids=["q-lora", "q-proj"])
# the linear form keeps float64 throughout; the dense one (attention.py's reference) softmaxes in fp32
@pytest.mark.parametrize(
    ("form", "tol"), [(ttt_attention, 1e-10), (ttt_attention_dense, 1e-6)], ids=["linear", "dense"]
)
def test_mla_attention_is_exact_against_a_dense_float64_reference(monkeypatch, q_lora_rank, form, tol):
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 1)  # several query blocks, one partial
    monkeypatch.setattr(attention, "MIN_BLOCK_ROWS", 8)
    config = draft_config_from_target(SMALL | {"q_lora_rank": q_lora_rank}, 40)
    torch.manual_seed(0)
    module = MLAAttention(config, form).double()
    xs = [
        torch.randn(2, 21, 2 * config.hidden_size, dtype=torch.float64, requires_grad=True) for _ in range(4)
    ]
    cache, outs = [], []
    positions = torch.arange(21)[None].expand(2, -1)
    for k, x in enumerate(xs):
        cos, sin = module.rotary(positions)
        outs.append(module(x, cos, sin, cache))
        expected = mla_reference(module, xs[: k + 1])
        torch.testing.assert_close(outs[-1], expected, rtol=tol, atol=tol)
    assert [tuple(k.shape[-1:]) + tuple(v.shape[-1:]) for k, v in cache] == [(32, 16)] * 4
    grad = torch.randn_like(outs[-1])
    leaves = [*xs, *module.parameters()]
    got = torch.autograd.grad(outs[-1], leaves, grad, allow_unused=True)
    want = torch.autograd.grad(mla_reference(module, xs), leaves, grad, allow_unused=True)
    for a, b in zip(got, want, strict=True):
        if b is not None:
            torch.testing.assert_close(a, b, rtol=10 * tol, atol=tol)


def test_step_zero_equals_transformers_deepseek_v3_attention_with_yarn():
    """Our MLA (2H input) against transformers' DeepseekV3Attention built 2H wide, same weights: the
    rope (interleaved, YaRN), the scale and the latent path agree; o_proj's first H rows compared."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RotaryEmbedding,
    )

    config = draft_config_from_target(SMALL, 40)
    torch.manual_seed(1)
    ours = MLAAttention(config, ttt_attention).double()
    wide = {k: v for k, v in SMALL.items() if k != "model_type"} | {"hidden_size": 2 * config.hidden_size}
    theirs_config = DeepseekV3Config(**wide, attention_bias=False, rope_interleave=True)
    theirs_config._attn_implementation = "eager"
    theirs = DeepseekV3Attention(theirs_config, layer_idx=0).double().eval()
    state = {k: v for k, v in theirs.state_dict().items()}
    state["o_proj.weight"] = state["o_proj.weight"][: config.hidden_size]
    ours.load_state_dict(state)
    t = 40  # past the YaRN correction range's low frequencies at original length 16
    x = torch.randn(1, t, 2 * config.hidden_size, dtype=torch.float64)
    positions = torch.arange(t)[None]
    rotary = DeepseekV3RotaryEmbedding(theirs_config).double()
    mask = torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    expected = theirs(x, rotary(x, positions), mask)[0][..., : config.hidden_size]
    cos, sin = ours.rotary(positions)
    torch.testing.assert_close(ours(x, cos, sin, []), expected, rtol=1e-5, atol=1e-6)  # rope tables in fp32


def test_the_mla_draft_trains_alike_with_either_attention():
    config = draft_config_from_target(SMALL, 40)
    torch.manual_seed(0)
    linear, dense = Eagle3Draft(config), Eagle3Draft(config, attention=ttt_attention_dense)
    dense.load_state_dict(linear.state_dict())
    ids, aux = torch.randint(0, 80, (2, 30)), torch.randn(2, 30, 3 * config.hidden_size)
    losses = []
    for model in (linear, dense):
        loss = sum(0.8**k * logits.logsumexp(-1).mean() for k, logits in enumerate(model(aux, ids, steps=4)))
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[0], losses[1])
    for (name, a), b in zip(linear.named_parameters(), dense.parameters(), strict=True):
        if a.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


# vLLM 0.32 deepseek_eagle3.py: Eagle3DeepseekV2ForCausalLM.load_weights prefixes "model." (but lm_head),
# renames d2t and skips t2d; DeepseekV2Eagle3Model.hf_to_vllm_mapper renames midlayer. and stacks
# q_a_proj + kv_a_proj_with_mqa into fused_qkv_a_proj (shards 0, 1), gate_proj + up_proj into gate_up_proj.
VLLM_STACKED = {".q_a_proj": (".fused_qkv_a_proj", 0), ".kv_a_proj_with_mqa": (".fused_qkv_a_proj", 1)}
VLLM_STACKED |= {".gate_proj": (".gate_up_proj", 0), ".up_proj": (".gate_up_proj", 1)}


def vllm_parameters(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """The vLLM parameter each exported tensor loads into, with the parameter's shape (stacked shards
    concatenated along dim 0), by the loader's own renaming rules."""
    shapes: dict[str, list[tuple[int, ...]]] = {}
    for name, tensor in tensors.items():
        if name == "t2d":
            continue
        name = "draft_id_to_target_id" if name == "d2t" else name if "lm_head" in name else "model." + name
        name = name.replace("midlayer.", "layers.0.")
        for old, (new, _) in VLLM_STACKED.items():
            name = name.replace(old, new) if old + "." in name else name
        shapes.setdefault(name, []).append(tuple(tensor.shape))
    return {k: (sum(s[0] for s in v), *v[0][1:]) for k, v in shapes.items()}


def test_the_export_loads_into_vllms_eagle3_deepseek_v2_parameters(tmp_path):
    config = draft_config_from_target(SMALL, 40, fc_norm=True)
    torch.manual_seed(0)
    model = Eagle3Draft(config)
    weights = tmp_path / "trained.safetensors"
    save_file(model.exported_state_dict(), weights, metadata={"draft_config": json.dumps(config.to_dict())})
    build_vocab_map([], 80, 40, tmp_path / "vocab.safetensors", counts=Counter(range(0, 80, 2)))
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps(SMALL))
    (tmp_path / "meta.json").write_text(json.dumps({"aux_layers_vllm": [1, 2, 3]}))
    out = tmp_path / "checkpoint"
    export_checkpoint(
        weights, tmp_path / "vocab.safetensors", tmp_path / "target" / "config.json", tmp_path / "meta.json",
        out / "config.json", out / "model.safetensors", speculators_dir=tmp_path / "speculators",
    )  # fmt: skip
    from safetensors.torch import load_file

    tensors = load_file(out / "model.safetensors")
    h, c = config.hidden_size, config
    layer = "model.layers.0."
    assert vllm_parameters(tensors) == {
        "model.fc.weight": (h, 3 * h),
        **{f"model.fc_norm.{i}.weight": (h,) for i in range(3)},
        "model.norm.weight": (h,),
        "lm_head.weight": (40, h),
        "draft_id_to_target_id": (40,),
        layer + "input_layernorm.weight": (h,),
        layer + "hidden_norm.weight": (h,),
        layer + "post_attention_layernorm.weight": (h,),
        # layer 0 reads 2H: DeepseekV2MLAAttention(input_size=2 * hidden_size)
        layer + "self_attn.fused_qkv_a_proj.weight": (
            c.q_lora_rank + c.kv_lora_rank + c.qk_rope_head_dim,
            2 * h,
        ),
        layer + "self_attn.q_a_layernorm.weight": (c.q_lora_rank,),
        layer + "self_attn.q_b_proj.weight": (4 * 32, c.q_lora_rank),
        layer + "self_attn.kv_a_layernorm.weight": (c.kv_lora_rank,),
        layer + "self_attn.kv_b_proj.weight": (4 * (24 + 16), c.kv_lora_rank),
        layer + "self_attn.o_proj.weight": (h, 4 * 16),
        layer + "mlp.gate_up_proj.weight": (2 * 96, h),
        layer + "mlp.down_proj.weight": (h, 96),
    }
    written = json.loads((out / "config.json").read_text())
    assert written["architectures"] == [MLA_ARCHITECTURE] and written["model_type"] == "deepseek_v2"
    assert "n_routed_experts" not in written and written["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert written["rope_scaling"] == c.rope_scaling and written["fc_norm"] and not written["norm_before_fc"]
    # the offline replay rebuilds the draft from config.json's keys (validate/offline.py load_draft)
    rebuilt = {k: written[k] for k in DraftConfig.__dataclass_fields__ if k in written}
    assert DraftConfig(**rebuilt) == config
    assert json.loads((tmp_path / "speculators" / "config.json").read_text())["error"] == SPECULATORS_REFUSAL


def test_the_checkpoint_config_is_a_deepseek_v2_config_with_the_targets_mla():
    from transformers import DeepseekV2Config

    config = draft_config_from_target(KIMI_K25_TEXT, 32000)
    loaded = DeepseekV2Config(**checkpoint_config(config, [2, 30, 58]))
    assert (loaded.q_lora_rank, loaded.kv_lora_rank, loaded.v_head_dim, loaded.head_dim) == (
        1536,
        512,
        128,
        64,
    )
    assert loaded.rope_parameters["rope_type"] == "yarn" and loaded.rope_parameters["factor"] == 64.0
    assert loaded.num_hidden_layers == 1


def test_mla_tensors_are_checked_and_speculators_refused():
    config = draft_config_from_target(SMALL, 80)
    tensors = Eagle3Draft(config).exported_state_dict()
    assert set(tensors) == expected_keys(config)
    check_tensors(tensors, config)
    tensors["midlayer.self_attn.kv_a_proj_with_mqa.weight"] = torch.zeros(40, 64)  # read H, not 2H
    with pytest.raises(ValueError, match="kv_a_proj_with_mqa.weight has shape"):
        check_tensors(tensors, config)
    with pytest.raises(ValueError, match="no speculators-format checkpoint for an MLA draft"):
        speculators_config(config, [1, 2, 3], "target", ["DeepseekV3ForCausalLM"], 3)


def test_value_width_and_scale_pass_through_the_linear_attention(monkeypatch):
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 1)
    monkeypatch.setattr(attention, "MIN_BLOCK_ROWS", 4)
    torch.manual_seed(3)

    def t(width):
        return torch.randn(1, 2, 6, width, dtype=torch.float64, requires_grad=True)

    q, cache = t(6), [(t(6), t(3)) for _ in range(3)]

    def fn(q, *flat):
        return ttt_attention(q, list(zip(flat[0::2], flat[1::2], strict=True)), scale=0.7)

    assert fn(q, *[x for kv in cache for x in kv]).shape == (1, 2, 6, 3)
    assert torch.autograd.gradcheck(fn, (q, *[x for kv in cache for x in kv]))
