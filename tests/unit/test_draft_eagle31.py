"""EAGLE-3.1's options (draft.norm_before_fc, draft.fc_norm, draft.norm_output): each changes the draft's
forward as speculators defines it, training's forward and the step-by-step one agree, and the trained
tensors round-trip through both exported formats (EAGLE and speculators) back into the same draft."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from support.speculators_export import export_model

from eagle3_pipeline.config import ConfigError, check_config
from eagle3_pipeline.draft.export import WEIGHT_KEYS, hub_id_of, verifier_name
from eagle3_pipeline.draft.model import Eagle3Draft, shift_left
from eagle3_pipeline.draft_config import DraftConfig, draft_config_from_target, read_target_config
from eagle3_pipeline.validate.offline import load_draft

REPO = Path(__file__).resolve().parents[2]
OPTIONS = ("norm_before_fc", "fc_norm", "norm_output")


def draft(random_target, seed: int = 0, **options: bool) -> Eagle3Draft:
    config = draft_config_from_target(read_target_config(random_target), 40, **options)
    torch.manual_seed(seed)
    model = Eagle3Draft(config).eval()
    with torch.no_grad():  # norms away from their initial ones, so that a norm left out shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def same_weights(source: Eagle3Draft, destination: Eagle3Draft) -> Eagle3Draft:
    destination.load_state_dict(source.state_dict(), strict=False)  # the option's own norms stay
    return destination


def aux(seed: int = 1, tokens: int = 9) -> torch.Tensor:
    return torch.randn(1, tokens, 3 * 64, generator=torch.Generator().manual_seed(seed)) * 3


def test_norm_before_fc_is_one_norm_over_the_concatenated_states(random_target):
    model = draft(random_target, norm_before_fc=True)
    x = aux()
    assert torch.allclose(model.project(x), model.fc(model.input_norm(x)))
    assert torch.allclose(model.project(4 * x), model.project(x), atol=1e-5)  # scale-free input
    scaled = torch.cat([4 * x[..., :64], x[..., 64:]], -1)  # one state scaled: the single norm sees it
    assert not torch.allclose(model.project(scaled), model.project(x), atol=1e-3)
    assert model.fc_norm is None


def test_fc_norm_is_one_norm_per_auxiliary_state(random_target):
    model = draft(random_target, fc_norm=True)
    x = aux()
    low, mid, high = x.chunk(3, dim=-1)
    normed = torch.cat([model.fc_norm[0](low), model.fc_norm[1](mid), model.fc_norm[2](high)], -1)
    assert torch.allclose(model.project(x), model.fc(normed))
    scaled = torch.cat([4 * low, mid, high], -1)  # each state normed on its own: scaling one is a no-op
    assert torch.allclose(model.project(scaled), model.project(x), atol=1e-5)
    assert model.input_norm is None


def test_norm_output_feeds_the_normed_state_back(random_target):
    plain = draft(random_target)
    fed_normed = same_weights(plain, draft(random_target, norm_output=True))
    ids = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(2))
    positions = torch.arange(9)[None]
    hidden = plain.project(aux())
    with torch.no_grad():
        after, logits = plain.step(ids, hidden, positions, [])
        fed, normed_logits = fed_normed.step(ids, hidden, positions, [])
        assert torch.equal(logits, normed_logits)  # the first step's guess is the same
        assert torch.allclose(fed, plain.norm(after))  # what goes on: norm(h'), not h'
        second = plain.step(ids, after, positions + 1, [])[1]
        assert not torch.allclose(second, fed_normed.step(ids, fed, positions + 1, [])[1], atol=1e-3)


@pytest.mark.parametrize("option", OPTIONS)
def test_training_forward_is_the_step_chain(random_target, option):
    """hidden_states() (training) and step() (offline acceptance, as vLLM drafts) agree with the option on."""
    model = draft(random_target, **{option: True})
    ids = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(3))
    x = aux()
    with torch.no_grad():
        trained = model(x, ids, steps=3)
        hidden, cache, chained = model.project(x), [], []
        for k in range(3):
            hidden, logits = model.step(shift_left(ids, 1 + k), hidden, torch.arange(9)[None] + k, cache)
            chained.append(logits)
    for a, b in zip(trained, chained, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_the_options_are_exclusive_where_nothing_serves_both(random_target):
    with pytest.raises(ValueError, match="draft.norm_before_fc and draft.fc_norm"):
        draft_config_from_target(read_target_config(random_target), 40, norm_before_fc=True, fc_norm=True)


def test_the_config_refuses_both_norms_naming_the_keys(tmp_path):
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["draft"] |= {"norm_before_fc": True, "fc_norm": True}
    with pytest.raises(ConfigError, match="'draft.norm_before_fc' and 'draft.fc_norm'"):
        check_config(config, REPO / "config" / "schema.yaml")


def export_both(model: Eagle3Draft, random_target, tmp_path) -> tuple[dict, dict]:
    return export_model(model, random_target, tmp_path, aux_layers=[1, 1, 0], speculative_tokens=5)


@pytest.mark.parametrize("option", [None, *OPTIONS])
def test_the_options_round_trip_through_both_formats(random_target, tmp_path, option):
    options = {option: True} if option else {}
    model = draft(random_target, **options)
    eagle, spec = export_both(model, random_target, tmp_path)
    flags = {"norm_before_residual": False} | {o: o == option for o in OPTIONS}
    assert {k: eagle[k] for k in flags} == flags  # where vLLM's llama_eagle3.py reads them
    assert {k: spec[k] for k in flags} == flags  # where vLLM's speculators reader and speculators do
    eagle_tensors = load_file(tmp_path / "checkpoint" / "model.safetensors")
    spec_tensors = load_file(tmp_path / "speculators" / "model.safetensors")
    extra = {"norm_before_fc": {"input_norm.weight"}, "fc_norm": {f"fc_norm.{i}.weight" for i in range(3)}}
    assert set(eagle_tensors) == set(WEIGHT_KEYS) | {"d2t", "t2d"} | extra.get(option, set())
    renamed = {k.replace("midlayer.", "layers.0."): v for k, v in eagle_tensors.items()}
    assert renamed.keys() == spec_tensors.keys()
    assert all(torch.equal(renamed[k], spec_tensors[k]) for k in renamed)
    # back into a draft (the offline check's loader): the same numbers as the bf16-rounded original
    loaded, _ = load_draft(tmp_path / "checkpoint", random_target, torch.device("cpu"))
    assert loaded.config == model.config
    rounded = {k: v.to(torch.bfloat16).float() for k, v in model.exported_state_dict().items()}
    model.load_trained(rounded | {"embed_tokens.weight": loaded.embed_tokens.weight})  # the target's
    ids = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        for a, b in zip(model(aux(), ids, steps=2), loaded(aux(), ids, steps=2), strict=True):
            assert torch.allclose(a, b, atol=1e-5)


def test_speculators_config_names_the_verifier_and_the_layout(random_target, tmp_path):
    _, spec = export_both(draft(random_target), random_target, tmp_path)
    assert spec["speculators_model_type"] == "eagle3" and spec["architectures"] == ["Eagle3Speculator"]
    method = spec["speculators_config"]["proposal_methods"][0]
    assert (method["proposal_type"], method["speculative_tokens"]) == ("greedy", 5)
    verifier = spec["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": str(random_target.resolve()), "architectures": ["LlamaForCausalLM"]}
    layer = spec["transformer_layer_config"]
    assert (layer["model_type"], layer["num_hidden_layers"], layer["vocab_size"]) == ("llama", 1, 96)
    assert (layer["hidden_size"], layer["head_dim"], layer["num_key_value_heads"]) == (64, 32, 1)
    assert (spec["draft_vocab_size"], spec["target_hidden_size"]) == (40, 64)
    assert spec["eagle_aux_hidden_state_layer_ids"] == [2, 2, 1]  # vLLM's numbering, which speculators shares


def test_draft_config_defaults_keep_older_trained_weights_loadable():
    fields = {"hidden_size": 8, "target_hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 1}
    fields |= {"num_key_value_heads": 1, "head_dim": 8, "rms_norm_eps": 1e-6, "rope_theta": 1e4}
    fields |= {"max_position_embeddings": 64, "vocab_size": 96, "draft_vocab_size": 40}
    config = DraftConfig(**fields)  # a draft_config written before EAGLE-3.1's keys
    assert (config.norm_before_fc, config.fc_norm, config.norm_output) == (False, False, False)


@pytest.mark.parametrize(
    ("folder", "hub_id"),
    [
        ("/data/hub/models--moonshotai--Kimi-K2.5/snapshots/3f1a2b", "moonshotai/Kimi-K2.5"),
        ("/h/models--org--name.with-dots_1/snapshots/abc/", "org/name.with-dots_1"),
        ("/models/Kimi-K2.5", None),
        ("/h/models--org--name/blobs/abc", None),
    ],
)
def test_a_target_in_the_hubs_cache_is_known_by_its_hub_id(folder, hub_id):
    assert hub_id_of(folder) == hub_id


def test_the_verifier_is_target_hub_id_else_the_cache_snapshots_else_the_local_path(random_target, caplog):
    snapshot = "/hub/models--org--target/snapshots/0123"
    assert verifier_name(random_target, "moonshotai/Kimi-K2.5") == "moonshotai/Kimi-K2.5"  # target.hub_id
    assert verifier_name(snapshot) == "org/target"
    assert verifier_name(random_target) == str(random_target.resolve())
    assert "vllm serve" in caplog.text and "target.hub_id" in caplog.text  # the form that serves it
