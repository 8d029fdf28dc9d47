"""The embedded demo: the bundled sample, its reasoning text and the unit template (seconds, no fit).

The builder's output (rule build_demo_target) is checked in tests/workflow/test_demo_target_rule.py and
the fitted target, offline and served by vLLM, in tests/integration/test_demo_target.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eagle3_pipeline.demo.fit import synthesise_reasoning
from eagle3_pipeline.demo.sample import SOURCES, dumps_sample, generate_sample
from eagle3_pipeline.demo.target import (
    load_rows,
    render_unit,
)
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


def test_a_fit_by_steps_takes_that_many_steps_whatever_the_cpu_time():
    """FitOptions.steps (the suite's own target): a step count, not the CPU budget, ends the fit."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle3_pipeline.demo.fit import FitOptions, fit
    from eagle3_pipeline.settings import DemoSettings

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=8)  # fmt: skip
    torch.manual_seed(0)
    examples = [([1, 2, 3, 4, 5, 6], 2), ([3, 4, 5, 6, 7], 1), ([9, 8, 7, 6], 2)]
    figures = fit(
        LlamaForCausalLM(config),
        examples,
        0,
        DemoSettings(fit_seconds=1e9),
        FitOptions(steps=4, batch_size=2),
    )
    assert figures["steps"] == 4 and figures["seconds"] < 60
