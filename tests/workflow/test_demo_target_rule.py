"""Rule build_demo_target through Snakemake, from an empty directory, with a fit of a few seconds: the
builder's files and shapes (a loadable Llama, its tokenizer's chat tokens and template, its unit), not a
useful model. The other workflow tests take the shared fitted target instead (support.workflow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from support.workflow import failure, scratch_workdir, workdir_run
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle3_pipeline.demo.tokenizer import CHAT_TOKENS, THINK_TOKENS

pytestmark = pytest.mark.slow
GENERATION_PROMPT = "<|im_assistant|>assistant<|im_middle|><think>"


@pytest.fixture(scope="module")
def short_target(tmp_path_factory) -> Path:
    """The rule run with `demo.fit_seconds: 2` (only its outputs requested)."""
    workdir = scratch_workdir(tmp_path_factory.mktemp("demo-rule"))
    (workdir / "c.yaml").write_text(yaml.safe_dump({"demo": {"port": 18999, "fit_seconds": 2}}))
    result = workdir_run(
        workdir, "resources/demo/vllm-demo.service", "--configfile", "c.yaml", "--cores", "2"
    )
    if result.returncode != 0:
        pytest.fail(failure(result, workdir / "results"))
    return workdir / "resources" / "demo" / "target"


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
