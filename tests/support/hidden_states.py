"""Fixtures for the hidden-state tests: a tiny Llama target with a Kimi-style template, and traces.

The demo target (resources/demo/target) is used when it has been built; otherwise a random 8-layer
LlamaForCausalLM (hidden 128, 2 heads of 64) with a small byte-level BPE is saved once per session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

DEMO_TARGET = Path(__file__).resolve().parents[2] / "resources" / "demo" / "target"
SPECIAL_TOKENS = [
    "<|im_system|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_middle|>",
    "<|im_end|>",
    "<think>",
    "</think>",
]
KIMI_STYLE_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}<|im_system|>system<|im_middle|>{{ m.content }}<|im_end|>"
    "{%- elif m.role == 'user' -%}<|im_user|>user<|im_middle|>{{ m.content }}<|im_end|>"
    "{%- elif m.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if loop.last and m.reasoning_content -%}<think>{{ m.reasoning_content }}</think>"
    "{%- elif not loop.last -%}<think></think>{%- endif -%}"
    "{{ m.content }}<|im_end|>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|><think>{%- endif -%}"
)
CORPUS = [
    "I need to compute 12 + 30. 12 + 30 = 42. The answer is 42.",
    "What is the capital of France? Let me think. Paris is the capital. The answer is Paris.",
    "Sort the list 3, 1, 2. The sorted list is 1, 2, 3.",
] * 20


def build_tiny_target(directory: Path, num_layers: int = 8) -> Path:
    """Save a random tiny Llama with a byte-level BPE tokenizer and a Kimi-style template."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>")
    tokenizer.chat_template = KIMI_STYLE_TEMPLATE
    tokenizer.save_pretrained(directory)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def trace_rows(tokenizer: Any, n: int = 6, shard: int = 0, start: int = 0) -> list[dict[str, Any]]:
    """Trace rows as merge_traces writes them, with server-style token ids from the template."""
    rows = []
    for i in range(start, start + n):
        question = f"What is {i} + {2 * i}?"
        reasoning = "I need to compute it. " * (1 + i % 3)
        content = f"The answer is {3 * i}."
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer(f"{reasoning}</think>{content}<|im_end|>", add_special_tokens=False)[
            "input_ids"
        ]
        rows.append(
            {
                "id": f"id{i:04d}",
                "shard": shard,
                "source": "test",
                "system": None,
                "question": question,
                "reasoning": reasoning,
                "content": content,
                "finish_reason": "stop",
                "prompt_token_ids": prompt_ids,
                "completion_token_ids": completion_ids,
                "status": "ok",
            }
        )
    return rows


def write_traces(path: Path, rows: list[dict[str, Any]]) -> Path:
    """The traces parquet with merge_traces' column types (shard int32, token ids list[int32])."""
    frame = pl.DataFrame(
        rows,
        schema_overrides={
            "shard": pl.Int32,
            "prompt_token_ids": pl.List(pl.Int32),
            "completion_token_ids": pl.List(pl.Int32),
            "system": pl.Utf8,
        },
    )
    frame.write_parquet(path)
    return path


@pytest.fixture(scope="session")
def hs_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo target if built (with a chat template), else a random tiny Llama saved once."""
    if (DEMO_TARGET / "model.safetensors").exists() and (DEMO_TARGET / "tokenizer.json").exists():
        return DEMO_TARGET
    return build_tiny_target(tmp_path_factory.mktemp("tiny_target"))


@pytest.fixture(scope="session")
def hs_tokenizer(hs_target: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(hs_target))
