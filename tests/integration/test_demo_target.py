"""The fitted demo target: greedy decoding thinks, closes </think> and answers, offline (the target rule
build_demo_target built, when there is one, else the suite's) and served by the real vLLM CPU server
(the shared one)."""

from __future__ import annotations

import pytest
import requests
from support.demo_check import greedy_replies
from support.vllm_server import SAMPLE, demo_target_dir

from eagle3_pipeline.demo.target import load_rows


@pytest.mark.slow
def test_fitted_target_thinks_then_answers():
    """The demo's built target when there is one, else the suite's own (fitted once, the same steps):
    every test that serves a target relies on it closing </think>."""
    questions = [
        row["conversations"][-2 if row["conversations"][-1]["from"] == "gpt" else -1]["value"]
        for row in load_rows(SAMPLE)[:8]
    ]
    replies = greedy_replies(demo_target_dir(), questions, max_new_tokens=300)
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
