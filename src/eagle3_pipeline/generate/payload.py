"""The request: sampling parameters (what is sent, and what of it shapes the answer) and the body.

Every sampling value may be null: it is then not sent, and the served model's own default applies
(vLLM takes it from the model's generation_config.json unless started with --generation-config vllm).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from eagle3_pipeline.settings import GenerationSettings, later_values, rerun_keys, rerun_params, runtime_keys

# Sent only when not null; null leaves the value to the served model's generation defaults.
# the vLLM names this module relies on (vllm_compat.py checks them in each supported release's wheel)
VLLM_NAMES = (
    ("key", "vllm/entrypoints/openai/", "return_token_ids"),
    ("key", "vllm/entrypoints/openai/", "chat_template_kwargs"),
    ("key", "vllm/entrypoints/openai/", "top_k"),
    ("key", "vllm/entrypoints/openai/", "min_p"),
    ("key", "vllm/entrypoints/openai/", "repetition_penalty"),
)
OPTIONAL_SAMPLING = ("top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
# What the pipeline itself sets: extra_body may not override it.
RESERVED_KEYS = frozenset(
    {"model", "messages", "max_tokens", "return_token_ids", "seed", "stream", "n", "chat_template_kwargs"}
    | {"temperature", "top_p", *OPTIONAL_SAMPLING}
)


@dataclass(frozen=True)
class Sampling:
    """What shapes an answer besides the question; what is sent goes into the journal's params hash.

    temperature, top_p and the OPTIONAL_SAMPLING values are sent only when not None (None: the
    served model's own default applies); `extra_body` is merged into the request's JSON as is.
    """

    model: str
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clash = sorted(RESERVED_KEYS & set(self.extra_body))
        if clash:
            raise ValueError(
                f"generation.extra_body sets {clash}, which the pipeline sets itself: use the "
                "generation.* key of that name instead"
            )

    @classmethod
    def from_settings(cls, generation: GenerationSettings, model: str) -> Sampling:
        """The requests' sampling: generation.* (sampling_params' keys) for served model `model`."""
        return cls(
            model=model,
            max_tokens=generation.max_tokens,
            temperature=generation.temperature,
            top_p=generation.top_p,
            seed=generation.seed,
            chat_template_kwargs=dict(generation.chat_template_kwargs),
            **{key: getattr(generation, key) for key in OPTIONAL_SAMPLING},
            extra_body=dict(generation.extra_body),
        )

    @property
    def thinking_off(self) -> bool:
        """Whether chat_template_kwargs switch thinking off (Kimi `thinking`, Qwen3 `enable_thinking`)."""
        return any(self.chat_template_kwargs.get(key) is False for key in ("thinking", "enable_thinking"))

    def identity(self) -> dict[str, Any]:
        """The fields that shape the answer, for the journal's params hash.

        The original six are always present (journals written before the optional keys existed stay
        valid); an optional value counts only when it is sent.
        """
        keys = ("model", "max_tokens", "temperature", "top_p", "seed", "chat_template_kwargs")
        fields_ = {key: getattr(self, key) for key in keys}
        fields_ |= {key: getattr(self, key) for key in OPTIONAL_SAMPLING if getattr(self, key) is not None}
        if self.extra_body:
            fields_["extra_body"] = self.extra_body
        return fields_

    def options(self) -> dict[str, Any]:
        """The sampling values sent with every request (None values left out)."""
        sent = {key: getattr(self, key) for key in ("temperature", "top_p", *OPTIONAL_SAMPLING)}
        return {key: value for key, value in sent.items() if value is not None}


def request_seed(base: int | None, prompt_id: str) -> int | None:
    """The per-request seed: derived from generation.seed and the id, so a retry samples the same."""
    if base is None:
        return None
    digest = hashlib.blake2b(f"{base}:{prompt_id}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


def chat_messages(prompt: dict[str, Any], history: list[dict[str, str]] | None = None) -> list[dict]:
    """system (when present), the earlier turns of the conversation (when given), the question."""
    messages = [{"role": "system", "content": prompt["system"]}] if prompt.get("system") else []
    messages.extend(history or ())
    messages.append({"role": "user", "content": prompt["question"]})
    return messages


def chat_body(
    prompt: dict[str, Any], sampling: Sampling, history: list[dict[str, str]] | None = None
) -> bytes:
    """The JSON body of /v1/chat/completions for one question."""
    body: dict[str, Any] = {
        "model": sampling.model,
        "messages": chat_messages(prompt, history),
        "max_tokens": sampling.max_tokens,
        **sampling.options(),
        "return_token_ids": True,
    }
    seed = request_seed(sampling.seed, prompt["id"])
    if seed is not None:
        body["seed"] = seed
    if sampling.chat_template_kwargs:
        body["chat_template_kwargs"] = sampling.chat_template_kwargs
    body.update(sampling.extra_body)
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


# The generation.* a shard records (settings.py declares each key's role): the sampling and history, in
# config/config.yaml's order (Snakemake compares params by their repr: a run recorded when the rule passed
# the raw section, a config written from that file, keeps its finished shards); a key added after the
# first release (LATER_KEYS, with the value that makes it a no-op: not sent / default) only while set.
SHARD_KEYS = rerun_keys(GenerationSettings, "generate_shard")
# generation.* that pace the requests without shaping an answer: run-time only in the rules
PACING_KEYS = runtime_keys(GenerationSettings, "generate_shard")
LATER_KEYS = later_values(GenerationSettings)


def sampling_params(generation: GenerationSettings) -> dict[str, Any]:
    """The generation.* keys that shape a request (what Sampling.from_settings reads), as the preflights'
    params: the later keys last, the order in which the first runs recorded them."""
    params = rerun_params(generation, "preflight")
    return {key: value for key, value in params.items() if key not in LATER_KEYS} | {
        key: value for key, value in params.items() if key in LATER_KEYS
    }


def shard_params(generation: GenerationSettings) -> dict[str, Any]:
    """generation.* less PACING_KEYS (the sampling and history), as a generation shard's params."""
    return rerun_params(generation, "generate_shard")


def serve_check_params(generation: GenerationSettings) -> dict[str, Any]:
    """The serve check's generation.* params: the sampling, then its own (concurrency: the tokens/s it
    compares depend on it)."""
    sampling = sampling_params(generation)
    own = {k: v for k, v in rerun_params(generation, "serve_check").items() if k not in sampling}
    return sampling | own
