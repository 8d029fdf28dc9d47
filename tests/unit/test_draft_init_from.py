"""draft.init_from: a draft read back from both exported formats and a public draft's layout loads into
training exactly; a draft of another target or shape is refused naming the key; a different vocabulary
map keeps the rows of the tokens both hold; training fine-tunes from it."""

from __future__ import annotations

import json
import logging
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3_pipeline.draft.export import export_checkpoint
from eagle3_pipeline.draft.init_from import (
    read_starting_draft,
    remap_rows,
    start_training_from,
    write_eagle_checkpoint,
)
from eagle3_pipeline.draft.train import TrainJob, build_model, fingerprint, main, write_weights
from eagle3_pipeline.draft.vocab import load_vocab_map, vocab_map
from eagle3_pipeline.validate.offline import load_draft

torch.set_num_threads(1)


@pytest.fixture
def job(draft_train_job: TrainJob) -> TrainJob:
    return draft_train_job


def _trained(job: TrainJob, path: Path, seed: int = 7) -> Path:
    """A draft of the job's shape whose every tensor differs from the seeded init: a stand-in for a
    trained one, written as train_draft writes its weights."""
    model, _ = build_model(job)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.exported_state_dict().items():
            tensor.add_(0.1 * torch.randn(tensor.shape, generator=generator))
            assert name  # every exported tensor perturbed
    write_weights(model.exported_state_dict(), model.config, path)
    return path


def _export(job: TrainJob, root: Path, vocab: str | None = None) -> tuple[Path, Path]:
    """(EAGLE folder, speculators folder) of a perturbed draft exported with `vocab` (the job's)."""
    weights = _trained(job, root / "trained.safetensors")
    eagle, speculators = root / "checkpoint", root / "speculators"
    export_checkpoint(
        weights,
        vocab or job.vocab_map,
        Path(job.target) / "config.json",
        Path(job.train_shards[0]).with_suffix(".json"),
        eagle / "config.json",
        eagle / "model.safetensors",
        speculators_dir=speculators,
    )
    return eagle, speculators


def _started(job: TrainJob, folder: Path) -> torch.nn.Module:
    model, head = build_model(job)
    start_training_from(model, str(folder), head["draft_ids"], job.train_shards[0])
    return model


def _inputs(job: TrainJob) -> tuple[torch.Tensor, torch.Tensor]:
    shard = load_file(job.validation_shards[0])
    n = int(shard["offsets"][1])
    return shard["aux_hidden_states"][None, :n].float(), shard["input_ids"][None, :n].long()


def test_our_export_round_trips_to_the_same_weights_and_logits(job, tmp_path):
    eagle, _ = _export(job, tmp_path)
    model = _started(job, eagle)
    exported = load_file(eagle / "model.safetensors")
    loaded = model.exported_state_dict()
    assert set(loaded) == set(exported) - {"d2t", "t2d"}
    for name, tensor in loaded.items():
        assert torch.equal(tensor, exported[name].float()), name
    reference, _ = load_draft(eagle, job.target, torch.device("cpu"))  # the offline check's reader
    aux, ids = _inputs(job)
    with torch.no_grad():
        ours, theirs = model.eval()(aux, ids, 3), reference(aux, ids, 3)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


def test_the_speculators_format_loads_the_same_tensors(job, tmp_path):
    eagle, speculators = _export(job, tmp_path)
    assert any(k.startswith("layers.0.") for k in load_file(speculators / "model.safetensors"))
    start = read_starting_draft(speculators)
    assert (
        start.format == "speculators" and start.aux_layers_vllm == read_starting_draft(eagle).aux_layers_vllm
    )
    from_eagle, from_speculators = _started(job, eagle), _started(job, speculators)
    for name, tensor in from_eagle.exported_state_dict().items():
        assert torch.equal(tensor, from_speculators.exported_state_dict()[name]), name


def test_a_public_drafts_layout_loads(job, tmp_path):
    """EAGLE's own releases (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): pytorch_model.bin, a config without
    head_dim, target_hidden_size or layer ids, half precision; here with embeddings in the file too."""
    eagle, _ = _export(job, tmp_path)
    public = tmp_path / "public"
    public.mkdir()
    config = json.loads((eagle / "config.json").read_text())
    for key in ("head_dim", "target_hidden_size", "eagle_aux_hidden_state_layer_ids", "eagle_config"):
        config.pop(key)
    (public / "config.json").write_text(json.dumps(config))
    tensors = {
        k: v.half() if v.is_floating_point() else v for k, v in load_file(eagle / "model.safetensors").items()
    }
    tensors["embed_tokens.weight"] = torch.zeros(96, 64, dtype=torch.float16)
    torch.save(tensors, public / "pytorch_model.bin")
    start = read_starting_draft(public)
    assert start.aux_layers_vllm is None and start.shape["head_dim"] == 32
    model = _started(job, public)
    assert torch.equal(model.exported_state_dict()["fc.weight"], tensors["fc.weight"].float())


def _edit_config(folder: Path, root: Path, **changes) -> Path:
    copy = root / f"edited-{len(list(root.iterdir()))}"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text()) | changes
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_a_draft_of_another_target_is_refused_naming_both_sizes_and_the_key(job, tmp_path):
    eagle, _ = _export(job, tmp_path)
    other = _edit_config(eagle, tmp_path, hidden_size=128, target_hidden_size=128)
    with pytest.raises(ValueError, match=r"hidden_size 128 \(starting draft\) != 64 .*target\.model"):
        _started(job, other)


def test_other_auxiliary_layers_are_refused_naming_hidden_states_layers(job, tmp_path):
    eagle, _ = _export(job, tmp_path)
    ours = read_starting_draft(eagle).aux_layers_vllm
    other = _edit_config(eagle, tmp_path, eagle_aux_hidden_state_layer_ids=[1, 2, 3])
    with pytest.raises(
        ValueError, match=rf"\[1, 2, 3\].*!= {re.escape(str(ours))}.*hidden_states\.layers: \[0, 1, 2\]"
    ):
        _started(job, other)


def test_an_fc_over_another_number_of_states_is_refused(job, tmp_path):
    eagle, _ = _export(job, tmp_path)
    tensors = load_file(eagle / "model.safetensors")
    tensors["fc.weight"] = tensors["fc.weight"][:, :128].contiguous()  # EAGLE-1/2 style: 2 states
    save_file(tensors, str(eagle / "model.safetensors"))
    with pytest.raises(ValueError, match=r"fc reads 128 features \(2 auxiliary states of 64\)"):
        _started(job, eagle)


def test_another_attention_shape_is_refused_naming_the_draft_key(job, tmp_path):
    eagle, _ = _export(job, tmp_path)  # the target's: 2 heads of 32
    wider = replace(job, draft=replace(job.draft, num_attention_heads=4, head_dim=16, num_key_value_heads=2))
    with pytest.raises(ValueError, match=r"num_attention_heads 2 .*set draft\.num_attention_heads: 2"):
        _started(wider, eagle)


def test_an_mla_draft_is_refused_for_a_llama_run_naming_draft_architecture(job, tmp_path):
    eagle, _ = _export(job, tmp_path)
    mla = _edit_config(
        eagle, tmp_path, architectures=["Eagle3DeepseekV2ForCausalLM"], model_type="deepseek_v2"
    )
    with pytest.raises(
        ValueError, match=r"a deepseek_mla draft, this run's is llama: set draft\.architecture"
    ):
        _started(job, mla)


def test_another_vocabulary_map_keeps_the_rows_of_shared_tokens(job, tmp_path, caplog):
    d2t, t2d = vocab_map(torch.arange(10, 74), 96)  # tokens 10..73: 54 shared with the run's map
    save_file({"d2t": d2t, "t2d": t2d}, str(tmp_path / "other_vocab.safetensors"))
    eagle, _ = _export(job, tmp_path, vocab=str(tmp_path / "other_vocab.safetensors"))
    start_rows = load_file(eagle / "model.safetensors")["lm_head.weight"].float()
    fresh, head = build_model(job)
    seeded = fresh.lm_head.weight.detach().clone()
    with caplog.at_level(logging.INFO, logger="eagle3_pipeline.draft.init_from"):
        start_training_from(fresh, str(eagle), head["draft_ids"], job.train_shards[0])
    ours = (torch.arange(64) + load_vocab_map(job.vocab_map)[0]).tolist()  # the run's target ids
    shared = [t for t in ours if 10 <= t < 74]
    rows = fresh.lm_head.weight.detach()
    for row, token in enumerate(ours):
        expected = start_rows[token - 10] if token in shared else seeded[row]
        assert torch.equal(rows[row], expected), token
    carried = (
        f"{len(shared)} of this run's 64 draft tokens carried over by target token id, {64 - len(shared)} new"
    )
    assert carried in caplog.text


def test_remap_rows_by_target_id():
    rows = torch.tensor([[1.0], [2.0], [3.0]])
    out, carried = remap_rows(rows, torch.tensor([2, 5, 9]), torch.tensor([0, 5, 9, 11]), torch.zeros(4, 1))
    assert carried == 2 and out.flatten().tolist() == [0.0, 2.0, 3.0, 0.0]


def test_the_starting_draft_is_part_of_the_resume_fingerprint(job, tmp_path):
    eagle, _ = _export(job, tmp_path)
    started = replace(job, draft=replace(job.draft, init_from=str(eagle)))
    assert fingerprint(started) != fingerprint(job)


def test_training_fine_tunes_from_an_exported_draft(job, tmp_path):
    """A run from scratch, exported, then a run started from that export: it starts where the first
    ended (its first epoch's loss below the first run's) instead of from the seeded init."""
    assert main(job)
    eagle = tmp_path / "export"
    export_checkpoint(
        job.weights,
        job.vocab_map,
        Path(job.target) / "config.json",
        Path(job.train_shards[0]).with_suffix(".json"),
        eagle / "config.json",
        eagle / "model.safetensors",
    )
    tuned = replace(
        job,
        draft=replace(job.draft, init_from=str(eagle)),
        work=str(tmp_path / "work-tuned"),
        weights=str(tmp_path / "tuned" / "model.safetensors"),
        history=str(tmp_path / "tuned" / "history.json"),
    )
    assert main(tuned)
    scratch = json.loads(Path(job.history).read_text())
    fine_tuned = json.loads(Path(tuned.history).read_text())
    assert fine_tuned[0]["train"]["loss"] < scratch[0]["train"]["loss"]
    assert fine_tuned[0]["validation"]["loss"] <= scratch[-1]["validation"]["loss"] + 0.05


def test_the_starting_draft_is_written_for_the_offline_check_with_its_own_vocabulary(job, tmp_path):
    d2t, t2d = vocab_map(torch.arange(10, 74), 96)
    save_file({"d2t": d2t, "t2d": t2d}, str(tmp_path / "other_vocab.safetensors"))
    _, speculators = _export(job, tmp_path, vocab=str(tmp_path / "other_vocab.safetensors"))
    model, _ = build_model(job)
    aux = read_starting_draft(speculators).aux_layers_vllm
    folder = write_eagle_checkpoint(speculators, model.config, aux, tmp_path / "init_checkpoint")
    draft, d2t_read = load_draft(folder, job.target, torch.device("cpu"))
    assert torch.equal(d2t_read, d2t)
    stored = load_file(speculators / "model.safetensors")
    assert torch.equal(draft.fc.weight, stored["fc.weight"].float())


def test_the_report_shows_the_starting_draft_beside_the_trained_one(tmp_path):
    from support.figures import read_figure_text
    from support.validate_results import write_finished_results

    from eagle3_pipeline.validate.report import draw_report

    inputs = {k: str(v) for k, v in write_finished_results(tmp_path / "results", True).items()}
    trained = json.loads(Path(inputs["offline"]).read_text())
    init = tmp_path / "results" / "validation" / "offline_init.json"
    init.write_text(json.dumps(trained | {"acceptance_length": [1.25, 1.5, 1.625]}))
    names = ("server.html", "trace_stats.html", "trace_lengths.png", "training.png", "acceptance.png")
    keys = ("server", "trace_stats", "trace_lengths", "training", "acceptance", "comparison", "slices")
    outputs = dict(
        zip(keys, (str(tmp_path / n) for n in (*names, "comparison.png", "slices.png")), strict=True)
    )
    draw_report(inputs | {"offline_init": str(init)}, outputs)
    panel = next(
        p for p in read_figure_text(outputs["comparison"]) if p["title"].startswith("Acceptance length")
    )
    length = trained["acceptance_length"]
    assert f"target's own traces, offline: {length[-1]:.2f} at k = {len(length)}" in panel["legend"]
    assert "starting draft (draft.init_from), offline: 1.62 at k = 3" in panel["legend"]


def test_the_starting_draft_gets_the_offline_check_of_the_trained_one(job, tmp_path):
    from eagle3_pipeline.validate.offline import validate_offline, validate_starting_draft

    eagle, speculators = _export(job, tmp_path)
    common = {"shard_paths": job.validation_shards, "steps": 3}
    direct = validate_offline(eagle, job.target, output_path=tmp_path / "offline.json", **common)
    init = validate_starting_draft(
        speculators,
        job.target,
        job.draft,
        work=tmp_path / "work",
        output_path=tmp_path / "init.json",
        **common,
    )
    assert init["acceptance_length"] == direct["acceptance_length"] and init["anchors"] == direct["anchors"]
    assert json.loads((tmp_path / "init.json").read_text())["acceptance_length"] == init["acceptance_length"]


def test_windowed_training_starts_its_first_window_from_the_draft(job, tmp_path, monkeypatch):
    """Under a disk cap only the very first window loads the starting draft; every later one starts
    from the previous window's state."""
    from test_draft_train import _windowed

    import eagle3_pipeline.draft.train as train

    eagle, _ = _export(job, tmp_path)
    started = replace(job, draft=replace(job.draft, init_from=str(eagle)), train=replace(job.train, epochs=1))
    loaded = []
    real = train.start_training_from
    monkeypatch.setattr(train, "start_training_from", lambda *a: loaded.append(a[1]) or real(*a))
    jobs = _windowed(started, tmp_path / "windows", epochs=1)
    for window_job in jobs:
        assert main(window_job)
    assert loaded == [str(eagle)]  # the first window's job only


# A DeepseekV3-family target's config as the MLA draft reads it (tests/unit/test_draft_mla.py's shape, small)
MLA_TARGET = {
    "model_type": "deepseek_v3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "q_lora_rank": 32,
    "kv_lora_rank": 48,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "vocab_size": 96,
    "rope_theta": 10000.0,
    "max_position_embeddings": 256,
}


def test_an_mla_draft_round_trips_through_its_export(tmp_path):
    from eagle3_pipeline.draft.init_from import load_into
    from eagle3_pipeline.draft.model import Eagle3Draft
    from eagle3_pipeline.draft.vocab import draft_ids
    from eagle3_pipeline.draft_config import draft_config_from_target

    (tmp_path / "config.json").write_text(json.dumps(MLA_TARGET))
    (tmp_path / "shard.json").write_text(json.dumps({"aux_layers_vllm": [1, 2, 3]}))
    d2t, t2d = vocab_map(torch.arange(20, 60), 96)
    save_file({"d2t": d2t, "t2d": t2d}, str(tmp_path / "vocab.safetensors"))
    config = draft_config_from_target(MLA_TARGET, 40)
    assert config.architecture == "deepseek_mla"
    torch.manual_seed(3)
    trained = Eagle3Draft(config)
    write_weights(trained.exported_state_dict(), config, tmp_path / "trained.safetensors")
    out = tmp_path / "checkpoint"
    export_checkpoint(
        tmp_path / "trained.safetensors",
        tmp_path / "vocab.safetensors",
        tmp_path / "config.json",
        tmp_path / "shard.json",
        out / "config.json",
        out / "model.safetensors",
    )
    torch.manual_seed(4)
    fresh = Eagle3Draft(config)
    assert load_into(fresh, read_starting_draft(out), draft_ids(d2t), [1, 2, 3]) == 40
    exported = load_file(out / "model.safetensors")
    for name, tensor in fresh.exported_state_dict().items():
        assert torch.equal(tensor, exported[name].float()), name


def test_a_folder_without_a_draft_is_refused_naming_the_key(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"draft\.init_from: .*config\.json does not exist"):
        read_starting_draft(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(
        FileNotFoundError, match=r"has none of \['model\.safetensors', 'pytorch_model\.bin'\]"
    ):
        read_starting_draft(tmp_path)
