"""The served check against the real vLLM CPU server and the real demo target: a draft trained by the
pipeline's own code on the target's own greedy outputs is accepted (length > 1) and beats an untrained
draft on held-out questions.

Flow (one test, minutes of CPU): serve the target with an untrained draft; with that server collect
greedy traces for training questions (speculative decoding does not change greedy output) and measure
the untrained draft on validation questions; extract hidden states, build the vocab map, train a few
hundred steps and export with the pipeline's code; serve the trained draft through the rule's own entry
(`run_local_serve_check`) and compare.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


@pytest.fixture(scope="module")
def demo_target(tmp_path_factory) -> Path:
    """resources/demo/target when built (rule build_demo_target), else built here (a shorter fit)."""
    built = REPO / "resources" / "demo" / "target"
    if (built / "config.json").exists() and (built / "tokenizer.json").exists():
        return built
    from eagle3_pipeline.demo.fit import FitSettings
    from eagle3_pipeline.demo.target import build_demo_target

    root = tmp_path_factory.mktemp("demo")
    build_demo_target(
        REPO / "config/demo/sample.jsonl",
        REPO / "config/demo/vllm-demo.service.in",
        root / "target",
        root / "unit.service",
        18598,
        FitSettings(seconds=60),
        repo=REPO,
    )
    return root / "target"


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
                "original_answer": turns.get("gpt"),
            }
        )
    return out


def write_unit(target: Path, path: Path) -> Path:
    from eagle3_pipeline.demo.target import render_unit

    template = (REPO / "config/demo/vllm-demo.service.in").read_text()
    path.write_text(render_unit(template, REPO, target, 18597))  # the check replaces the port
    return path


def traces_frame(asked: list[dict], outcomes: list[dict]) -> pl.DataFrame:
    rows = [q | o | {"shard": 0} for q, o in zip(asked, outcomes, strict=True) if o["status"] == "ok"]
    frame = pl.DataFrame(rows).select(
        "id",
        "shard",
        "system",
        "question",
        "reasoning",
        "content",
        "prompt_token_ids",
        "completion_token_ids",
        "status",
    )
    return frame.with_columns(pl.col("shard").cast(pl.Int32))


def train_draft(target: Path, traces: Path, work: Path) -> Path:
    """Extraction, vocab map, training and export: the pipeline's stage code, small settings."""
    from eagle3_pipeline.draft.export import export_checkpoint
    from eagle3_pipeline.draft.train import TrainJob, main
    from eagle3_pipeline.draft.vocab import build_vocab_map
    from eagle3_pipeline.hidden_states.extract import ExtractSettings, extract_shard

    shard = work / "hidden_states" / "shard-00000.safetensors"
    extract_shard(
        ExtractSettings(
            traces=traces,
            shard=0,
            target=target,
            output=shard,
            metadata=shard.with_suffix(".json"),
            work=work / "extract",
            max_seq_len=1024,
        )
    )
    vocab_size = json.loads((target / "config.json").read_text())["vocab_size"]
    build_vocab_map([shard.with_suffix(".json")], vocab_size, 512, work / "vocab_map.safetensors")
    job = TrainJob(
        train_shards=[str(shard)],
        validation_shards=[str(shard)],
        vocab_map=str(work / "vocab_map.safetensors"),
        target=str(target),
        draft={"draft_vocab_size": 512, "ttt_steps": 3, "step_weight_decay": 0.8},
        train={
            "epochs": 40,
            "lr": 3e-3,
            "warmup_ratio": 0.05,
            "weight_decay": 0.0,
            "grad_clip": 0.5,
            "batch_tokens": 4096,
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


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="needs the vLLM CPU venv (make install-vllm)")
def test_trained_draft_is_accepted_and_beats_an_untrained_one(demo_target, tmp_path):
    from support.validate_models import write_untrained_draft

    from eagle3_pipeline.generate.client import Sampling
    from eagle3_pipeline.server.lifecycle import local_command
    from eagle3_pipeline.validate.serve_check import (
        ask,
        free_port,
        measure,
        run_local_serve_check,
        serve_local,
        with_speculative_draft,
    )

    server_cfg = {
        "host": "local",
        "unit": "vllm-demo.service",
        "unit_file": str(write_unit(demo_target, tmp_path / "u")),
    }
    train_questions, validation = questions(96), questions(8, skip=300)
    greedy = Sampling(model="eagle3-demo-target", max_tokens=256, temperature=0.0, top_p=1.0, seed=0)
    check = Sampling(model="eagle3-demo-target", max_tokens=128, temperature=0.0, top_p=1.0, seed=0)
    untrained = write_untrained_draft(tmp_path / "untrained", demo_target, draft_vocab_size=512)

    argv, env, cwd = local_command(server_cfg)
    port = free_port(18580, 18599)
    served = with_speculative_draft(argv, str(untrained), 3, "127.0.0.1", port)
    handle = serve_local(served, env, cwd, tmp_path / "state", f"http://127.0.0.1:{port}", 600)
    try:
        outcomes = ask(f"http://127.0.0.1:{port}", train_questions, greedy, None, 16, 300, 1)
        before = measure(f"http://127.0.0.1:{port}", validation, check, concurrency=8)
    finally:
        handle.stop()
    traces_frame(train_questions, outcomes).write_parquet(tmp_path / "traces.parquet")

    checkpoint = train_draft(demo_target, tmp_path / "traces.parquet", tmp_path / "draft")
    after = run_local_serve_check(server_cfg, checkpoint, validation, check, tmp_path / "state", 3)
    (tmp_path / "result.json").write_text(json.dumps({"untrained": before, "trained": after}, indent=1))

    assert before["answered"] == after["answered"] == len(validation)
    assert after["drafts"] > 0 and len(after["per_position_rate"]) == 3
    assert after["acceptance_length"] > 1.0
    assert after["acceptance_length"] > before["acceptance_length"], (before, after)
