"""The demo target's tokenizer: a byte-level BPE trained on the sample, with Kimi-K2.5's chat tokens.

The chat template follows Kimi-K2.5: ``<|im_user|>user<|im_middle|>...<|im_end|>``; the generation
prompt ends with ``<|im_assistant|>assistant<|im_middle|><think>`` (``<think></think>`` when the
``thinking`` kwarg is false); the assistant turns after the last user turn render
``<think>reasoning</think>content``, earlier ones ``<think></think>content`` (Kimi drops history
reasoning).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from eagle3_pipeline.target_shape import DEMO_TARGET_SHAPE

VOCAB_SIZE = DEMO_TARGET_SHAPE["vocab_size"]
BOS, PAD, EOS = "[BOS]", "[PAD]", "<|im_end|>"
CHAT_TOKENS = ["<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", EOS]
# Not "special": vLLM skips special tokens when it detokenizes, and the reasoning parser needs these.
THINK_TOKENS = ["<think>", "</think>"]
SPECIAL_TOKENS = [BOS, PAD, *CHAT_TOKENS]

CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}<|im_system|>system<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- elif m['role'] == 'user' -%}<|im_user|>user<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- elif m['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if loop.index0 > ns.last_user -%}"
    "<think>{{ m.get('reasoning_content') or m.get('reasoning') or '' }}</think>"
    "{%- else -%}<think></think>{%- endif -%}"
    "{{ m['content'] or '' }}<|im_end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking is defined and thinking is false -%}<think></think>{%- else -%}<think>{%- endif -%}"
    "{%- endif -%}"
)


def train_tokenizer(texts: Iterable[str]) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE on ``texts`` and wrap it as a transformers fast tokenizer.

    Args:
        texts: Plain text (questions, reasoning, answers) without chat tokens.

    Returns:
        A tokenizer of exactly VOCAB_SIZE ids, the chat and think tokens single ids, eos ``<|im_end|>``.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(THINK_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """Save as tokenizer.json + tokenizer_config.json, the chat template inside the config (as Kimi's)."""
    tokenizer.save_pretrained(out_dir)
    (out_dir / "chat_template.jinja").unlink(missing_ok=True)
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(
        tokenizer_class="PreTrainedTokenizerFast",
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        add_bos_token=False,
        add_eos_token=False,
    )
    config_path.write_text(json.dumps(config, indent=2) + "\n")
