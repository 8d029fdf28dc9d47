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
