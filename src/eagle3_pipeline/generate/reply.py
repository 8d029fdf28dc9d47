"""The reply: reasoning, content, finish reason and token ids out of a vLLM chat completion or error.

Reasoning comes from `message.reasoning` (vLLM >= 0.16), then `reasoning_content` (older), else is
split out of `<think>...</think>` in the content (a server without a reasoning parser), including
output that holds only `</think>` because the prompt opened the block.
"""

from __future__ import annotations

import json
from typing import Any

# the vLLM names this module relies on (vllm_compat.py checks them in each supported release's wheel)
VLLM_NAMES = (
    ("key", "vllm/entrypoints/openai/", "reasoning"),
    ("key", "vllm/entrypoints/openai/", "prompt_token_ids"),
    ("key", "vllm/entrypoints/openai/", "token_ids"),
    ("key", "vllm/entrypoints/", "metrics"),
    ("key", "vllm/entrypoints/", "speculative_decoding"),
    ("key", "vllm/entrypoints/", "time_to_first_token_ms"),
    ("key", "vllm/entrypoints/", "mean_itl_ms"),
)
CONTEXT_HINTS = ("context length", "max_model_len", "maximum model length", "too long")


def split_thinking(text: str | None) -> tuple[str | None, str | None]:
    """(reasoning, content) from raw output of a server without a reasoning parser.

    `<think>R</think>C` and `R</think>C` (the prompt opened the block) give (R, C); `<think>R` (cut off
    by max_tokens) gives (R, ""); text without tags gives (None, text).
    """
    if text is None:
        return None, None
    close = text.find("</think>")
    if close >= 0:
        start = text.find("<think>", 0, close)
        reasoning = text[start + len("<think>") : close] if start >= 0 else text[:close]
        return reasoning, text[close + len("</think>") :]
    start = text.find("<think>")
    if start >= 0:
        return text[start + len("<think>") :], text[:start]
    return None, text


class MalformedReply(ValueError):
    """A 200 reply that is not a chat completion (bad JSON, no choices)."""


def parse_completion(data: Any) -> dict[str, Any]:
    """The stored fields of a 200 response: reasoning, content, finish_reason, token ids and counts.

    Raises:
        MalformedReply: the reply has no usable `choices[0]`.
    """
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedReply(f"200 reply without choices: {json.dumps(data)[:200]}")
    choice = choices[0]
    message = choice.get("message") or {}
    content = message.get("content")
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    if reasoning is None:
        reasoning, content = split_thinking(content)
    prompt_ids = data.get("prompt_token_ids")
    completion_ids = choice.get("token_ids")
    usage = data.get("usage") or {}
    # vLLM >= 0.32 with --per-request-spec-decode-metrics / --enable-per-request-metrics: this reply's
    # own draft counts and timing (the serve check's)
    metrics = data.get("metrics") if isinstance(data.get("metrics"), dict) else {}
    spec_decode = metrics.get("speculative_decoding")
    timing = {k: metrics[k] for k in ("time_to_first_token_ms", "mean_itl_ms") if metrics.get(k) is not None}
    extra = ({"spec_decode": spec_decode} if isinstance(spec_decode, dict) else {}) | (
        {"timing": timing} if timing else {}
    )
    return extra | {
        "reasoning": reasoning,
        "content": content,
        "finish_reason": choice.get("finish_reason"),
        "prompt_token_ids": prompt_ids,
        "completion_token_ids": completion_ids,
        "prompt_tokens": len(prompt_ids) if prompt_ids is not None else usage.get("prompt_tokens"),
        "completion_tokens": (
            len(completion_ids) if completion_ids is not None else usage.get("completion_tokens")
        ),
    }


def decode_reply(body: bytes) -> dict[str, Any]:
    """parse_completion of a raw 200 body; MalformedReply for bad JSON too."""
    try:
        data = json.loads(body)
    except ValueError as error:
        raise MalformedReply(f"200 reply is not JSON ({error}): {body[:200]!r}") from error
    return parse_completion(data)


def error_message(body: bytes) -> str:
    try:
        error = json.loads(body).get("error")
        message = error.get("message") if isinstance(error, dict) else error
        return str(message if message is not None else body[:500].decode(errors="replace"))
    except (ValueError, AttributeError):
        return body[:500].decode(errors="replace")


def is_context_error(status: int, message: str) -> bool:
    return status == 400 and any(hint in message.lower() for hint in CONTEXT_HINTS)
