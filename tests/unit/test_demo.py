"""The embedded demo: the bundled sample, the tiny target builder, and the target served by vLLM."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests
import torch
from support.demo_check import greedy_replies
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle3_pipeline.demo.fit import FitSettings, synthesise_reasoning
from eagle3_pipeline.demo.sample import SOURCES, dumps_sample, generate_sample
from eagle3_pipeline.demo.target import (
    build_demo_target,
    load_rows,
    render_unit,
)
from eagle3_pipeline.demo.tokenizer import CHAT_TOKENS, THINK_TOKENS
from eagle3_pipeline.server.unit import command_argv, merge_unit

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "config" / "demo" / "sample.jsonl"
UNIT_TEMPLATE = REPO / "config" / "demo" / "vllm-demo.service.in"
BUILT_TARGET = REPO / "resources" / "demo" / "target"
NUMBER = r"-?\$?(\d+(?:\.\d+)?)"
EQUATION = re.compile(rf"^Step \d+: {NUMBER} ([x+/-]) {NUMBER} = {NUMBER}", re.MULTILINE)
GENERATION_PROMPT = "<|im_assistant|>assistant<|im_middle|><think>"


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return load_rows(SAMPLE)


def test_committed_sample_is_the_generators_output():
    assert SAMPLE.read_text() == dumps_sample(generate_sample()), (
        "config/demo/sample.jsonl is stale: python -m eagle3_pipeline.demo.sample config/demo/sample.jsonl"
    )


def test_sample_schema_and_mix(rows):
    assert 300 <= len(rows) <= 400 and SAMPLE.stat().st_size < 400_000
    for row in rows:
        assert set(row) == {"conversations", "source"} and row["source"] in SOURCES
        roles = [turn["from"] for turn in row["conversations"] if turn["from"] != "system"]
        assert roles == ["human", "gpt"] * (len(roles) // 2) and roles
        assert all(turn["value"].strip() for turn in row["conversations"])
        assert all(turn["from"] != "system" for turn in row["conversations"][1:])
    assert {row["source"] for row in rows} == set(SOURCES)
    with_system = sum(row["conversations"][0]["from"] == "system" for row in rows)
    multi_turn = sum(sum(t["from"] == "gpt" for t in row["conversations"]) > 1 for row in rows)
    multi_step = sum(row["conversations"][-1]["value"].count("Step ") >= 3 for row in rows)
    assert with_system >= 30 and multi_turn >= 30 and multi_step >= 80


def test_sample_arithmetic_is_right(rows):
    checked = 0
    for row in rows:
        for turn in row["conversations"]:
            for a, op, b, result in EQUATION.findall(turn["value"]):
                x, y = float(a), float(b)
                value = {"+": x + y, "-": x - y, "x": x * y, "/": x / y}[op]
                assert abs(abs(value) - float(result)) < 0.01, turn["value"]
                checked += 1
    assert checked > 300


def test_reasoning_is_synthesised_from_the_row(rows):
    maths = next(r for r in rows if r["source"] == "demo-math")["conversations"]
    human, gpt = [t["value"] for t in maths if t["from"] != "system"][:2]
    reasoning = synthesise_reasoning(human, gpt)
    assert reasoning.startswith("I need to") and "=" in reasoning and "answer is" in reasoning
    code = synthesise_reasoning("Write a Python function that reverses a string. What does x return?", "...")
    assert "reverses a string" in code
    assert "What is gravity" in synthesise_reasoning("What is gravity?", "Gravity is ...")


def test_bad_sample_names_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"conversations": [{"from": "human", "value": "hi"}], "source": "x"}\n{"rows": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_rows(bad)


def test_unit_template_renders_a_vllm_command(tmp_path):
    unit = render_unit(UNIT_TEMPLATE.read_text(), REPO, tmp_path / "target", 18999)
    assert "@" not in unit and "[Service]" in unit and "Restart=on-failure" in unit
    parsed = merge_unit([("vllm-demo.service", unit)], "vllm-demo.service")  # the snapshot's parser
    argv = command_argv(parsed.exec_start[-1], parsed.environment, [])
    assert argv[:3] == [str(REPO / ".venv-vllm/bin/python"), "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--port") + 1] == "18999" and argv[argv.index("--model") + 1] == str(
        tmp_path / "target"
    )
    assert argv[argv.index("--reasoning-parser") + 1] == "kimi_k2"
    assert parsed.environment["VLLM_CPU_KVCACHE_SPACE"] == "1" and parsed.environment["HF_HUB_OFFLINE"] == "1"
    assert not parsed.unresolved and not parsed.warnings
    with pytest.raises(ValueError, match="@PORT@"):
        render_unit("ExecStart=@REPO@ @TARGET@", REPO, tmp_path, 1)


@pytest.fixture(scope="module")
def short_target(tmp_path_factory) -> Path:
    """The builder end to end with a fit of a few seconds: right files and shapes, not a useful model."""
    out = tmp_path_factory.mktemp("demo")
    build_demo_target(
        SAMPLE,
        UNIT_TEMPLATE,
        out / "target",
        out / "vllm-demo.service",
        18999,
        FitSettings(seconds=2),
        repo=REPO,
    )
    return out / "target"


def test_builder_writes_a_loadable_llama(short_target):
    names = {p.name for p in short_target.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert {"generation_config.json"} <= names and not list(short_target.parent.glob(".target*"))
    model = AutoModelForCausalLM.from_pretrained(short_target)
    config = model.config
    assert config.num_hidden_layers >= 8 and config.head_dim == 64 and config.hidden_size == 128
    assert config.vocab_size == 1024 and not config.tie_word_embeddings
    tokenizer = AutoTokenizer.from_pretrained(short_target)
    assert (
        json.loads((short_target / "generation_config.json").read_text())["eos_token_id"]
        == tokenizer.eos_token_id
    )
    ids = torch.tensor([tokenizer.encode("The answer is 42.", add_special_tokens=False)])
    assert model(ids).logits.shape == (1, ids.shape[1], 1024)
    assert (short_target.parent / "vllm-demo.service").read_text().count(str(short_target)) == 1


def test_tokenizer_chat_tokens_and_template(short_target):
    tokenizer = AutoTokenizer.from_pretrained(short_target)
    assert len(tokenizer) == 1024 and tokenizer.eos_token == "<|im_end|>"
    for token in CHAT_TOKENS + THINK_TOKENS:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == (
        "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"
        "<|im_user|>user<|im_middle|>What is 2 + 2?<|im_end|>" + GENERATION_PROMPT
    )
    off = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, thinking=False)
    assert off.endswith("<|im_assistant|>assistant<|im_middle|><think></think>")
    reply = {"role": "assistant", "content": "4", "reasoning_content": "2 + 2 = 4"}
    history = messages + [reply, {"role": "user", "content": "And 3 + 3?"}, dict(reply, content="6")]
    text = tokenizer.apply_chat_template(history, tokenize=False)
    assert text.count("<think></think>4<|im_end|>") == 1 and text.endswith(
        "<think>2 + 2 = 4</think>6<|im_end|>"
    )


@pytest.mark.slow
def test_fitted_target_thinks_then_answers():
    if not (BUILT_TARGET / "model.safetensors").exists():
        pytest.skip("resources/demo/target not built: snakemake --cores 2 resources/demo/vllm-demo.service")
    questions = [
        row["conversations"][-2 if row["conversations"][-1]["from"] == "gpt" else -1]["value"]
        for row in load_rows(SAMPLE)[:8]
    ]
    replies = greedy_replies(BUILT_TARGET, questions, max_new_tokens=300)
    good = [r for r in replies if r.closed_thinking and r.reasoning and r.content and r.finished]
    assert len(good) >= 6, replies


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_serves_reasoning_and_answer(demo_vllm_server):
    response = requests.post(
        f"{demo_vllm_server.base_url}/v1/chat/completions",
        json={
            "model": demo_vllm_server.model,
            "messages": [{"role": "user", "content": "What is 12 + 30?"}],
            "max_tokens": 400,
            "temperature": 0,
            "return_token_ids": True,
        },
        timeout=120,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    choice = body["choices"][0]
    assert choice["message"].get("reasoning") and choice["message"]["content"], choice
    assert choice["finish_reason"] == "stop"
    assert body["prompt_token_ids"] and choice["token_ids"]
