"""The embedded demo: a bundled sample dataset and a tiny, servable thinking target built offline."""

DEMO_HIDDEN_SIZE = 128  # the tiny target's hidden size (demo/fit.py); known before the target is built
# the rest of its shape (demo/fit.py, demo/tokenizer.py), for sizes planned before it exists (budget.py)
DEMO_TARGET_SHAPE = {
    "hidden_size": DEMO_HIDDEN_SIZE,
    "intermediate_size": 384,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 1024,
}

# demo.family: where each family's target and unit are built (rules/demo.smk) and its unit's template
DEMO_DIRS = {"llama": "resources/demo", "kimi": "resources/demo-kimi"}
DEMO_UNITS = {"llama": "vllm-demo.service", "kimi": "vllm-demo-kimi.service"}
UNIT_TEMPLATES = {
    "llama": "config/demo/vllm-demo.service.in",
    "kimi": "config/demo-kimi/vllm-demo-kimi.service.in",
}


def demo_target_dir(family: str) -> str:
    """The folder rule build_demo_target writes the demo.family's target into."""
    return f"{DEMO_DIRS[family]}/target"
