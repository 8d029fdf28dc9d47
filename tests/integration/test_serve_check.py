"""The served check against the real vLLM CPU server and the real demo target: a draft trained by the
pipeline's own code on the target's own greedy outputs is accepted (length > 1) and beats an untrained
draft on held-out questions.

Flow (one test, minutes of CPU): greedy replies of the target to training questions (its own outputs,
with token ids); hidden-state extraction, vocab map, a few hundred training steps and export with the
pipeline's own code; then the rule's entry (`run_local_serve_check`) serves the target twice, with an
untrained draft and with the trained one, on validation questions, and the counters are compared.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from support.vllm_server import copy_demo_target

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo_target(tmp_path_factory) -> Path:
    """A private copy of the shared demo target (fitted once: support.vllm_server), since these checks
    start and stop their own servers on it."""
    return copy_demo_target(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def training_traces(demo_target, tmp_path_factory) -> Path:
    """The target's greedy replies to the first 32 questions (128 tokens), computed once for both tests."""
    path = tmp_path_factory.mktemp("greedy") / "traces.parquet"
    greedy_traces(demo_target, questions(32), 128).write_parquet(path)
    return path


def questions(count: int, skip: int = 0) -> list[dict]:
    from eagle3_pipeline.demo.target import load_rows

    rows = load_rows(REPO / "config/demo/sample.jsonl")[skip : skip + count]
    out = []
    for i, row in enumerate(rows):
        turns = {t["from"]: t["value"] for t in row["conversations"]}
        out.append(
            {
                "id": f"q{skip + i:04d}",
                "system": turns.get("system"),
                "question": turns["human"],
                "source": row.get("source"),
                "original_answer": turns.get("gpt"),
            }
        )
    return out


def write_unit(target: Path, path: Path) -> Path:
    from eagle3_pipeline.demo.target import render_unit

    template = (REPO / "config/demo/vllm-demo.service.in").read_text()
    path.write_text(render_unit(template, REPO, target, 18597))  # the check replaces the port
    return path


def greedy_traces(target: Path, asked: list[dict], max_new_tokens: int) -> pl.DataFrame:
    """The target's own greedy replies (transformers, fp32) as trace rows with token ids: faster here than
    vLLM on a loaded 2-core machine, and the same argmax the served target verifies against."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    rows = []
    for q in asked:
        messages = ([{"role": "system", "content": q["system"]}] if q["system"] else []) + [
            {"role": "user", "content": q["question"]}
        ]
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False)
        completion = out[0, len(ids) :].tolist()
        rows.append(
            {
                "id": q["id"],
                "shard": 0,
                "system": q["system"],
                "question": q["question"],
                "reasoning": None,
                "content": tokenizer.decode(completion),
                "prompt_token_ids": ids,
                "completion_token_ids": completion,
                "status": "ok",
            }
        )
    return pl.DataFrame(
        rows,
        schema_overrides={
            "shard": pl.Int32,
            "prompt_token_ids": pl.List(pl.Int32),
            "completion_token_ids": pl.List(pl.Int32),
        },
    )


def extract(target: Path, traces: Path, shard: Path, layers: list | None = None) -> Path:
    """One hidden-state shard of the traces (the pipeline's extraction; `layers` as hidden_states.layers)."""
    from eagle3_pipeline.hidden_states.extract import ExtractSettings, extract_shard

    shard.parent.mkdir(parents=True, exist_ok=True)
    extract_shard(
        ExtractSettings(
            traces=traces,
            shard=0,
            target=target,
            output=shard,
            metadata=shard.with_suffix(".json"),
            work=shard.parent / "extract-work",
            max_seq_len=1024,
            layers=layers or ["auto"],
        )
    )
    return shard


def train_draft(target: Path, traces: Path, work: Path, layers: list | None = None) -> Path:
    """Extraction, vocab map, training and export: the pipeline's stage code, small settings."""
    from eagle3_pipeline.draft.export import export_checkpoint
    from eagle3_pipeline.draft.train import TrainJob, main
    from eagle3_pipeline.draft.vocab import build_vocab_map

    shard = extract(target, traces, work / "hidden_states" / "shard-00000.safetensors", layers)
    vocab_size = json.loads((target / "config.json").read_text())["vocab_size"]
    build_vocab_map([shard.with_suffix(".json")], vocab_size, 512, work / "vocab_map.safetensors")
    job = TrainJob(
        train_shards=[str(shard)],
        validation_shards=[],
        vocab_map=str(work / "vocab_map.safetensors"),
        target=str(target),
        draft={"draft_vocab_size": 512, "ttt_steps": 3, "step_weight_decay": 0.8},
        train={
            "epochs": 100,
            "lr": 3e-3,
            "warmup_ratio": 0.05,
            "weight_decay": 0.0,
            "grad_clip": 0.5,
            "batch_tokens": 2048,
            "seed": 0,
            "save_every_steps": 10_000,
        },
        work=str(work / "train"),
        weights=str(work / "trained.safetensors"),
        history=str(work / "history.json"),
    )
    assert main(job)
    checkpoint = work / "checkpoint"
    export_checkpoint(
        job.weights,
        job.vocab_map,
        target / "config.json",
        shard.with_suffix(".json"),
        checkpoint / "config.json",
        checkpoint / "model.safetensors",
    )
    return checkpoint


def test_trained_draft_is_accepted_and_beats_an_untrained_one(demo_target, training_traces, tmp_path):
    import torch
    from support.validate_models import write_untrained_draft

    from eagle3_pipeline.generate.client import Sampling
    from eagle3_pipeline.validate.serve_check import run_local_serve_check

    torch.set_num_threads(1)  # a shared 2-core machine: two OpenMP threads spin-wait for each other
    server_cfg = {
        "host": "local",
        "unit": "vllm-demo.service",
        "unit_file": str(write_unit(demo_target, tmp_path / "u")),
    }
    validation = questions(6, skip=300)
    check = Sampling(model="eagle3-demo-target", max_tokens=64, temperature=0.0, top_p=1.0, seed=0)
    trained = train_draft(demo_target, training_traces, tmp_path / "draft")
    untrained = write_untrained_draft(tmp_path / "untrained", demo_target, draft_vocab_size=512)

    before = run_local_serve_check(server_cfg, untrained, validation, check, tmp_path / "state0", 3)
    after = run_local_serve_check(server_cfg, trained, validation, check, tmp_path / "state1", 3)
    (tmp_path / "result.json").write_text(json.dumps({"untrained": before, "trained": after}, indent=1))

    assert before["answered"] == after["answered"] == len(validation)
    assert after["drafts"] > 0 and len(after["per_position_rate"]) == 3
    assert after["acceptance_length"] > 1.0
    assert after["acceptance_length"] > before["acceptance_length"], (before, after)


def test_a_draft_on_non_default_layers_is_served_as_trained(demo_target, training_traces, tmp_path):
    """The rule's entry (`serve_check`) on a draft trained on NON-default layers: vLLM's served acceptance
    per position matches the offline simulation on the same questions, acceptance by source and the
    speedup are reported; another checkpoint served in its place is refused. The figures land in
    tmp_path/figures.json (docs/validation.md)."""
    import torch

    from eagle3_pipeline.validate.offline import evaluate
    from eagle3_pipeline.validate.serve_check import ServeCheckError, serve_check

    torch.set_num_threads(1)
    layers = [0, 2, 6]  # the 8-layer target's default (auto) is [1, 3, 4]
    max_tokens = 64
    trained = train_draft(demo_target, training_traces, tmp_path / "draft", layers)
    config = json.loads((trained / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 7]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == layers

    # offline: the same validation questions, the target's greedy replies as long as the served ones
    asked = questions(12, skip=300)
    greedy_traces(demo_target, asked, max_tokens).write_parquet(tmp_path / "validation-traces.parquet")
    shard = extract(
        demo_target,
        tmp_path / "validation-traces.parquet",
        tmp_path / "val" / "shard-00000.safetensors",
        layers,
    )
    offline = evaluate(trained, demo_target, [shard], steps=3, device="cpu")
    (tmp_path / "offline.json").write_text(json.dumps(offline))

    pl.DataFrame([{k: q[k] for k in ("id", "system", "question", "source")} for q in asked]).write_parquet(
        tmp_path / "validation.parquet"
    )
    (tmp_path / "server.json").write_text(
        json.dumps({"model": str(demo_target), "served_model_name": "eagle3-demo-target"})
    )
    server_cfg = {
        "host": "local",
        "unit": "vllm-demo.service",
        "unit_file": str(write_unit(demo_target, tmp_path / "u")),
    }
    generation = {"max_tokens": max_tokens, "temperature": 0.0, "top_p": 1.0, "seed": 0, "concurrency": 4}
    validate = {
        "max_questions": 12,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "num_speculative_tokens": 3,
    }
    validate |= {"served_offline_tolerance": 0.15, "speedup": True, "enforce_eager": True}
    args = (tmp_path / "validation.parquet", tmp_path / "server.json", server_cfg, generation, validate)
    result = serve_check(
        trained, *args, tmp_path / "work", tmp_path / "serve_check.json", tmp_path / "offline.json"
    )

    # another checkpoint served in its place (an untrained draft of the same shape): refused. (The same
    # weights fed the default layers instead were accepted at 3.68 against 3.76 here: this repetitive
    # demo target cannot reveal a layer-numbering bug through acceptance; docs/validation.md.)
    from support.validate_models import write_untrained_draft

    wrong = write_untrained_draft(tmp_path / "untrained", demo_target, draft_vocab_size=512)
    with pytest.raises(ServeCheckError, match="does not behave like the trained one") as refused:
        serve_check(wrong, *args, tmp_path / "work-wrong", tmp_path / "wrong.json", tmp_path / "offline.json")
    rejected = json.loads((tmp_path / "work-wrong" / "serve_check.rejected.json").read_text())
    assert not (tmp_path / "wrong.json").exists() and "speedup" not in rejected  # failed before timing
    figures = {
        "offline": offline,
        "served": result,
        "wrong_checkpoint": rejected,
        "refusal": str(refused.value),
    }
    (tmp_path / "figures.json").write_text(json.dumps(figures, indent=1))

    comparison = result["offline_comparison"]
    assert comparison["enforced"] and comparison["agree"], comparison
    assert result["acceptance_length"] > 1.5, result["acceptance_length"]
    assert set(result["by_source"]) == {q["source"] for q in asked}
    assert all(part["drafts"] > 0 for part in result["by_source"].values())
    assert result["speedup"]["speedup"] is not None
    assert (
        result["speedup"]["completion_tokens_without_draft"] == result["completion_tokens"]
    )  # greedy: same text
    assert rejected["acceptance_length"] < 1.5 < result["acceptance_length"]
