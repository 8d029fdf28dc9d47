"""Check a built demo target offline (tests): does greedy decoding think, close ``</think>`` and answer?"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reply:
    """One greedy reply, split as vLLM's kimi_k2 parser would split it."""

    reasoning: str
    content: str
    finished: bool  # ended with the eos token (vLLM's finish_reason "stop")
    closed_thinking: bool  # wrote </think>


def greedy_replies(target_dir: str | Path, questions: list[str], max_new_tokens: int = 256) -> list[Reply]:
    """Generate greedily (thinking on) from the target in ``target_dir`` for each question.

    Args:
        target_dir: A folder with the model and tokenizer (resources/demo/target).
        questions: User messages, one conversation each.
        max_new_tokens: Generation cap per question.

    Returns:
        One Reply per question.
    """
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    replies = []
    for question in questions:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        new = out[0, ids.shape[1] :].tolist()
        finished = bool(new) and new[-1] == tokenizer.eos_token_id
        text = tokenizer.decode(new[:-1] if finished else new, skip_special_tokens=False)
        reasoning, closed, content = text.partition("</think>")
        replies.append(Reply(reasoning.strip(), content.strip(), finished, bool(closed)))
    return replies
