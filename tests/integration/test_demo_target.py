"""The fitted demo target: greedy decoding thinks, closes </think> and answers, offline (the target rule
build_demo_target built, when there is one) and served by the real vLLM CPU server (the shared one)."""

from __future__ import annotations

import pytest
import requests
from support.demo_check import greedy_replies
from support.vllm_server import BUILT_TARGET, SAMPLE

from eagle3_pipeline.demo.target import load_rows


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
